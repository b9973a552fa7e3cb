"""One pass as a shell command (``xformopt export``, ``fuse``, ``quantize``, ...): a model or the previous
stage's folder in, a stage folder out, with a manifest whose pass list extends the input's."""

from __future__ import annotations

import os
import time
from pathlib import Path

from xformopt import cache_stores
from xformopt.artifact import atomic_dir, check_output, hash_dir, read_manifest, write_json
from xformopt.errors import InputError
from xformopt.measure import host as host_facts
from xformopt.measure import memory
from xformopt.measure.host import effective_cpu_flags
from xformopt.models.validate import check_onnx_file
from xformopt.onnx_graph import SEQ2SEQ_GRAPHS, seq2seq_stage
from xformopt.passes import get_pass
from xformopt.passes.record import PassRecord
from xformopt.pipeline.execute import execute, raise_if_budget_missed
from xformopt.pipeline.manifest import build_manifest, input_record
from xformopt.pipeline.prepare import prepare, verification_context
from xformopt.recipe import PassStep, Recipe, check_order, validate_options
from xformopt.stale import sweep_at_start


def check_stage_dir(path: Path, kind: str) -> None:
    """The input of a single-pass command must be the kind of stage that pass consumes."""
    if kind == "hf":
        if path.is_dir() and ((path / "model.onnx").is_file() or seq2seq_stage(path)):
            raise InputError(f"{path} is an ONNX stage; this pass takes a PyTorch model directory (the input of export)")
        return
    if not path.exists():
        raise InputError(f"input not found: {path}")
    if kind == "onnx":
        model = path / "model.onnx"
        if not model.is_file() and seq2seq_stage(path):  # an encoder-decoder stage: its two graphs
            for name in SEQ2SEQ_GRAPHS:
                check_onnx_file(path / name)
            return
        if not model.is_file():
            raise InputError(f"{path} has no model.onnx; pass the output folder of `xformopt export`")
        check_onnx_file(model)


def run_single(
    pass_name: str,
    model: str,
    out: Path,
    options: dict,
    *,
    target: str = "auto",
    task: str | None = None,
    data: str | None = None,
    force: bool = False,
    trust_remote_code: bool = False,
    wait: bool = False,
) -> dict:
    """One pass as a shell command: MODEL (or a previous stage's folder) in, a stage folder out.

    The output carries a manifest whose pass list extends the input's, so a chain of commands
    records the same history ``optimize`` would.
    """
    pass_cls = get_pass(pass_name)
    check_output(out, force)
    validated = validate_options(pass_name, options, f"xformopt {pass_name}")
    check_stage_dir(Path(model), pass_cls.consumes)
    previous = {}
    if (Path(model) / "manifest.json").is_file():
        previous = read_manifest(Path(model))
    # The same ordering contract as a recipe: the input's pass history plus this pass.
    history = [entry["pass"] for entry in previous.get("passes", [])]
    start = get_pass((history or [pass_name])[0]).consumes  # the chain may have begun from an ONNX stage
    chain = Recipe.model_construct(passes=[PassStep(name=name) for name in [*history, pass_name]])
    check_order(chain, origin=f"xformopt {pass_name} {model}", start=start)
    # A chain keeps the task its first command chose (e.g. export --task feature-extraction).
    task = task or (previous.get("input") or {}).get("task")
    ready = prepare(model, [(pass_name, validated.model_dump())], out, force=force, target=target, task=task,
                    data=data, trust_remote_code=trust_remote_code)
    spec, protected = ready.spec, ready.protected
    ctx = verification_context(spec, ready.target, data, None, host_facts.usable_cpus(), effective_cpu_flags())
    sweep_at_start(Path(os.path.abspath(out)).parent)
    started = time.perf_counter()
    with atomic_dir(out, force, wait=wait, protected=protected) as tmp, cache_stores.in_use():
        with memory.measured(pass_name) as peak:
            record = execute(pass_cls, ctx, spec.path, tmp, validated)
            memory.release()
        entry = PassRecord(pass_name, record, validated.model_dump(), seconds=round(time.perf_counter() - started, 3),
                           memory=peak.to_dict())
        input_ = previous.get("input") or input_record(model, spec, hash_dir(spec.path), ready.origin)
        write_json(tmp / "manifest.json", build_manifest(input_, ready.target, [*previous.get("passes", []), entry.to_dict()]))
    raise_if_budget_missed([entry], out, entry.to_dict())
    return entry.to_dict()
