"""The order a shape search tries its shapes in, measured on this host: each listed shape is cut from the model
untrained (magnitude importance, xformopt/passes/prune/students.py), exported in memory, fully fused, and all of
them and the unpruned model are timed interleaved at batch 1 on real validation texts. Equal FLOPs are not equal
latency on a CPU at batch 1 (a dropped layer removes its ~20 operators with their fixed cost; a narrower hidden
size shrinks every GEMM): the time decides, FLOPs only break ties. About one export per shape (tens of seconds
each for a base-size model on 2 cores), small beside one distillation."""

from __future__ import annotations

import logging
import time

from xformopt import models
from xformopt.measure.host import host_info
from xformopt.passes import get_pass
from xformopt.passes.base import PassContext
from xformopt.passes.candidates import CandidateGraphs
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
        for i, shape in enumerate(shapes):
            options = options_model.model_validate({k: v for k, v in shape.items() if v is not None})
            _log.info(f"shape search: timing shape {i + 1}/{len(shapes)} untrained")
            graphs.add_model(f"shape{i}", cut_to(model, arch, options, target.simd_multiple, scores), pruned=True)
        stats = graphs.time_encoded(ROUNDS, tokenizer_dir=spec.path)
    host = host_info()
    return {
        "median_ms": [round(stats[f"shape{i}"]["median_ms"], 4) for i in range(len(shapes))],
        "unpruned_ms": round(stats["unpruned"]["median_ms"], 4),
        "what": "each shape cut from the model untrained (magnitude importance), ONNX fp32 fully fused, batch 1, "
                "real validation texts pre-tokenized, all shapes and the unpruned model interleaved",
        "measured_on": f"{host.get('cpu_model', 'this host')} ({threads} threads)",
        "rounds": ROUNDS, "seconds": round(time.perf_counter() - started, 1),
    }
