"""The order a shape search tries its shapes in, measured on this host: each listed shape is cut from the model
untrained (magnitude importance, xformopt/passes/prune/students.py), exported in memory, fully fused, and all of
them and the unpruned model are timed interleaved at batch 1 on real validation texts. Equal FLOPs are not equal
latency on a CPU at batch 1 (a dropped layer removes its ~20 operators with their fixed cost; a narrower hidden
size shrinks every GEMM): the time decides, FLOPs only break ties. A pretrained student (``student: minilm``) is
timed the same way: its own weights with the model's task head (untrained), exported and fused as its own family,
fed the same texts through its own tokenizer. About one export per shape (tens of seconds each for a base-size
model on 2 cores), small beside one distillation."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from xformopt import models
from xformopt.measure.host import host_info
from xformopt.passes import get_pass
from xformopt.passes.base import PassContext
from xformopt.passes.candidates import CandidateGraphs
from xformopt.passes.distill import pretrained
from xformopt.passes.prune.importance import magnitude_importance
from xformopt.passes.prune.students import cut_to
from xformopt.passes.prune.width import magnitude_channels
from xformopt.passes.surgery import arch_for

_log = logging.getLogger(__name__)

ROUNDS = 30  # interleaved batch-1 rounds: enough to order shapes that differ by more than a few percent


def time_shapes(spec, target, shapes: list[dict], texts: list[str], threads: int, shaper: str = "prune") -> dict:
    """Median batch-1 ms of each shape's untrained student (by position in ``shapes``) and of the unpruned
    model, and how they were measured."""
    started = time.perf_counter()
    ctx = PassContext(spec, target, list(texts), threads, quiet=True)
    options_model = get_pass(shaper).Options
    model = models.load_torch_model(spec, spec.path)
    model.requires_grad_(False)
    arch = arch_for(spec.model_type)
    heads, ffn, layers = magnitude_importance(model, arch)
    scores = (heads, ffn, layers, magnitude_channels(model, arch))
    with CandidateGraphs(ctx, "xformopt-shape-order-") as graphs:
        graphs.add_model("unpruned", model)
        own_tokenizers = {}
        for i, shape in enumerate(shapes):
            _log.info(f"shape search: timing shape {i + 1}/{len(shapes)} untrained")
            if shape.get("student"):
                own_tokenizers[f"shape{i}"] = _add_pretrained(graphs, f"shape{i}", shape["student"], spec)
                continue
            options = options_model.model_validate({k: v for k, v in shape.items() if v is not None})
            graphs.add_model(f"shape{i}", cut_to(model, arch, options, target.simd_multiple, scores), pruned=True)
        stats = graphs.time_encoded(ROUNDS, tokenizer_dir=spec.path, tokenizer_dirs=own_tokenizers)
    host = host_info()
    return {
        "median_ms": [round(stats[f"shape{i}"]["median_ms"], 4) for i in range(len(shapes))],
        "unpruned_ms": round(stats["unpruned"]["median_ms"], 4),
        "what": "each shape cut from the model untrained (magnitude importance; a pretrained student as it is, with "
                "the model's head), ONNX fp32 fully fused, batch 1, real validation texts pre-tokenized (a student "
                "by its own tokenizer), all shapes and the unpruned model interleaved",
        "measured_on": f"{host.get('cpu_model', 'this host')} ({threads} threads)",
        "rounds": ROUNDS, "seconds": round(time.perf_counter() - started, 1),
    }


def _add_pretrained(graphs: CandidateGraphs, key: str, source: str, spec) -> Path:
    """A pretrained student with the model's (fresh) head, exported and fused as its own family; returns the folder
    whose tokenizer it reads."""
    path = pretrained.locate(source)
    student = pretrained.PretrainedStudent(source, path, json.loads((path / "config.json").read_text()), False)
    teacher_config = json.loads((Path(spec.path) / "config.json").read_text())
    model = pretrained.load(student, spec.task_def, teacher_config, spec.trust_remote_code, eager=False)
    model.requires_grad_(False)
    graphs.add_model(key, model, spec=models.stage_spec(spec, path))
    return path
