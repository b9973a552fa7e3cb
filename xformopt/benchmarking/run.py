"""One bench run, as `xformopt bench` and ``xformopt.bench()`` do it: refuse unsafe output paths and an
incomparable baseline before timing, measure, compare, and write the JSON document and JUnit XML.

Encoder and encoder-decoder artifacts get the measurement and the regression gate (:mod:`.measure`,
:mod:`.seq2seq`, :mod:`.gate`); decoder artifacts the generation benchmark (:mod:`xformopt.decoder.bench`), which has no gate yet.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path

from xformopt.atomic import write_text as write_atomic
from xformopt.benchmarking import gate, measure
from xformopt.benchmarking import seq2seq as seq2seq_bench
from xformopt.benchmarking.junit import junit_xml
from xformopt.benchmarking.types import check_bench
from xformopt.decoder.bench import bench_artifact
from xformopt.errors import InputError
from xformopt.models.validate import check_threads

_log = logging.getLogger(__name__)


# Task.graph -> how bench measures the artifact (same document, same gate); decoders have their own bench.
# measure.measure is looked up at call time (a test replaces it).
MEASURES = {"encoder": lambda art, run: measure.measure(art, run), "seq2seq": seq2seq_bench.measure}


def check_writable(path: Path | None, flag: str) -> None:
    """Fail before measuring when an output file cannot be written."""
    if path is None:
        return
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{flag} {path} is a directory; pass a file path")
    parent = path.resolve().parent
    while not parent.exists():
        parent = parent.parent
    if not os.access(parent, os.W_OK):
        raise InputError(f"{flag}: cannot write to {parent}; choose another path")


def check_apart(artifact: Path, reads: tuple, **flags: Path | None) -> None:
    """Fail before measuring when an output file would overwrite what this run reads: a file of the
    artifact (model.onnx, report.json, ...), the data or baseline file, or the other output flag."""
    seen: dict[Path, str] = {}
    for flag, path in flags.items():
        if path is None:
            continue
        target = Path(path).resolve()
        inside = Path(artifact).resolve() in target.parents
        if (inside and target.exists()) or any(r is not None and target == Path(str(r).split("::")[0]).resolve()
                                               for r in reads):
            raise InputError(f"{flag} {path} would overwrite a file this run reads (artifact, data or baseline); "
                             "choose another path")
        if target in seen:
            raise InputError(f"{flag} and {seen[target]} are the same file {path}; give each its own path")
        seen[target] = flag
        if target.is_file() and not _is_earlier_output(target, junit=flag == "--junit"):
            raise InputError(f"{flag} {path} exists and is not an earlier bench {'JUnit XML' if flag == '--junit' else 'document'}; "
                             "remove it or choose another path (it is left untouched)")


def _is_earlier_output(path: Path, junit: bool) -> bool:
    """Only a file an earlier bench wrote may be replaced (never a config, a model or a data file)."""
    try:
        head = path.open("rb").read(4096).decode("utf-8", errors="replace").lstrip()
    except OSError:
        return False
    if junit:
        return head.startswith("<?xml") or head.startswith("<testsuite")
    return re.match(r'\{\s*"schema":\s*"xformopt\.([a-z]+-)?bench/', head) is not None


def write_document(doc: dict, out: Path | None) -> None:
    if out is not None:
        write_atomic(out, json.dumps(doc, indent=2, default=str) + "\n")
        _log.info(f"wrote {out}")


def lengths(values: Sequence[int] | None, flag: str, default: tuple[int, ...]) -> tuple[int, ...]:
    """Prompt or generation lengths: whole numbers of at least 1."""
    if values is None:
        return default
    numbers = tuple(values)
    if not numbers or any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in numbers):
        raise InputError(f"{flag} values must be whole numbers of at least 1 (got {', '.join(map(str, numbers)) or 'none'})")
    return numbers


def bench_generation(artifact: Path, *, compare: Sequence[Path] = (), pytorch: bool = True,
                     prompt_tokens: Sequence[int] | None = None, new_tokens: Sequence[int] | None = None,
                     cache_only: bool = False, rounds: int | None = None, threads: int | None = None,
                     seed: int | None = None, out: Path | None = None) -> dict:
    """The generation bench document of a decoder artifact (schema ``xformopt.generation-bench/1``)."""

    doc = bench_artifact(
        artifact, compare=compare or (), pytorch=pytorch, prompt_lengths=lengths(prompt_tokens, "--prompt-tokens", (16, 64)),
        new_tokens=lengths(new_tokens, "--new-tokens", (32, 128)),
        cache_modes=("cache",) if cache_only else ("cache", "no_cache"), rounds=rounds or 3, threads=threads,
        seed=seed or 0,
    )
    write_document(doc, out)
    return doc


def bench_encoder(artifact: Path, *, baseline: Path | None = None, data: Path | None = None,
                  text_column: str | None = None, text_pair_column: str | None = None, label_column: str | None = None,
                  limit: int | None = None, seed: int | None = None, threads: int | None = None,
                  rounds: int | None = None, warmup: int | None = None, repeats: int | None = None,
                  max_latency_regression: str | float = "5%", max_accuracy_drop: str | float = "0.5",
                  allow_host_mismatch: bool = False, out: Path | None = None, junit: Path | None = None) -> dict:
    """Measure an encoder or encoder-decoder artifact and compare it (see :mod:`.measure` for the document, :mod:`.gate`
    for ``comparison``); a baseline with other settings, or from another host without
    ``allow_host_mismatch``, is refused (InputError) before anything is timed."""

    started = time.perf_counter()
    limit_fraction = gate.parse_fraction(max_latency_regression)
    check_writable(out, "-o")
    check_writable(junit, "--junit")
    check_threads(threads)
    art = measure.load_artifact(artifact)
    check_apart(artifact, (art.evaluation.data,), **{"-o": out, "--junit": junit})  # the report's own data file
    base_doc = gate.load_baseline(baseline) if baseline is not None else None
    opts = measure.Overrides(data=data, text_column=text_column, text_pair_column=text_pair_column,
                             label_column=label_column, limit=limit, seed=seed, threads=threads,
                             rounds=rounds, warmup=warmup, repeats=repeats)
    run = measure.plan(art, opts)
    if base_doc is not None:  # refuse an incomparable baseline before spending time on timing
        gate.check_comparable(base_doc, measure.preview(art, run), allow_host_mismatch)
    doc = MEASURES[art.spec.task_def.graph](art, run)
    if base_doc is not None:
        comparison = gate.compare(base_doc, doc, max_latency_regression=limit_fraction, max_accuracy_drop=max_accuracy_drop,
                                  allow_host_mismatch=allow_host_mismatch, gated=True, baseline_path=str(baseline))
    elif art.report is None:  # a single-pass command's output: nothing of its own to compare with
        comparison = gate.no_comparison("no report.json to compare with (single-pass output); pass --baseline FILE")
    else:
        own = art.path / "report.json"
        comparison = gate.compare(art.report, doc, max_latency_regression=limit_fraction,
                                  max_accuracy_drop=max_accuracy_drop, gated=False, baseline_path=str(own))
    doc = {key: (comparison if key == "comparison" else doc[key]) for key in measure.TOP_LEVEL_KEYS}
    check_bench(doc)
    write_document(doc, out)
    if junit is not None:
        write_atomic(junit, junit_xml(comparison, artifact=art.path.name, seconds=time.perf_counter() - started,
                                      properties={"host_fingerprint": doc["host_fingerprint"]}))
        _log.info(f"wrote {junit}")
    return doc
