"""A pass's record as an object: what ran, with which options, from the cache or not, and what it
measured; ``summary()`` is the one line the pass itself writes about it (``Pass.summarize``)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from xformopt.passes import REGISTRY, get_pass


@dataclass(frozen=True)
class PassRecord:
    name: str  # the pass
    record: dict  # what the pass changed and the figures that verify it (JSON, in the manifest)
    options: dict = field(default_factory=dict)
    cache_key: str | None = None
    reused: bool = False
    seconds: float | None = None
    memory: dict | None = None  # peak RSS while the pass ran (xformopt/measure/memory.py: Peak.to_dict)

    def summary(self) -> str:
        if self.name not in REGISTRY:
            return json.dumps(self.record)[:200]
        return get_pass(self.name).summarize(self.record)

    def report_facts(self) -> dict:
        """Graph facts the report shows for this stage and the ones after it (fused ops, INT8 coverage)."""
        return get_pass(self.name).report_facts(self.record) if self.name in REGISTRY else {}

    @property
    def budget_met(self) -> bool | None:
        """False where the pass wrote its best attempt but missed what it had to reach (an accuracy or
        perplexity budget, quantize's agreement floor: ``record["verdict"]["passed"]``); the run then
        exits 1 after the artifact is written. None: the pass has no such target."""
        verdict = self.record.get("verdict")
        if isinstance(verdict, dict) and verdict.get("passed") is False:
            return False
        return self.record.get("budget_met")

    @property
    def accept(self) -> dict:
        """Option values that would accept the written attempt (e.g. ``{"min_agreement": 0.834}``)."""
        verdict = self.record.get("verdict")
        return dict(verdict.get("accept") or {}) if isinstance(verdict, dict) else {}

    def to_dict(self) -> dict:
        d = asdict(self)
        return {"pass": d.pop("name"), **{k: d[k] for k in ("options", "cache_key", "reused", "seconds", "memory")},
                "record": d["record"]}

    @classmethod
    def from_dict(cls, entry: dict) -> PassRecord:
        return cls(name=entry["pass"], record=entry.get("record") or {}, options=entry.get("options") or {},
                   cache_key=entry.get("cache_key"), reused=bool(entry.get("reused")), seconds=entry.get("seconds"),
                   memory=entry.get("memory"))
