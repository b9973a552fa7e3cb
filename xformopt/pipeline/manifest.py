"""A run's manifest.json: where the model came from and what was done to it. Apart from ``write.py`` so
that a single pass (``single.py``), which writes a manifest but evaluates nothing, does not stand on the
evaluation stack."""

from __future__ import annotations

from datetime import datetime, timezone

from xformopt import models, targets
from xformopt.artifact import MANIFEST_SCHEMA
from xformopt.data import TextDataset
from xformopt.measure.host import library_versions
from xformopt.recipe import Recipe


def input_record(source: str, spec: models.ModelSpec, sha256: str, origin: dict) -> dict:
    """The manifest's ``input``: the model a run (or a chain of single passes) started from. ``origin`` (the hub
    revision, the GGUF source: ``sources.origin``) was read when the model was resolved, so writing the manifest
    does not go back to the sources."""
    return {"source": source, "path": str(spec.path), "sha256": sha256, "model_type": spec.model_type, "task": spec.task,
            **origin}


def build_manifest(input_: dict, target: targets.Target, passes: list[dict], *, host: dict | None = None,
                   recipe: Recipe | None = None, heldout: TextDataset | None = None) -> dict:
    """manifest.json of a stage or an artifact; ``host``, ``recipe`` and ``heldout`` only for a recipe run."""
    manifest = {"schema": MANIFEST_SCHEMA, "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "input": input_, "target": target.to_dict()}
    if host is not None:
        manifest["host"] = host
    manifest["versions"] = library_versions()
    if recipe is not None:
        manifest["recipe"] = recipe.to_dict()
    if heldout is not None:
        manifest["heldout"] = {"path": heldout.path, "source": heldout.source, "rows": len(heldout)}
    manifest["passes"] = passes
    return manifest
