"""Evaluate and time every stage on the same held-out rows, with the PyTorch model as the baseline.

Latency is measured at batch 1 over the held-out texts at their true lengths, tokenization
included (the number users feel), with all stages interleaved in one process so machine drift
hits them alike.
"""

from __future__ import annotations

from collections.abc import Callable

from xformopt.bench.latency import compare, run_interleaved
from xformopt.evaluate.stage import score
from xformopt.onnx_graph import dir_size_bytes


def stage_predictor(stage, spec, threads: int):
    from xformopt.predictors import OrtPredictor, TorchPredictor

    if stage.kind == "hf":
        return TorchPredictor(spec, stage.path, threads=threads)
    return OrtPredictor(spec, stage.path, threads=threads)


def model_bytes(stage) -> int:
    """Size of the weights on disk (model.onnx or the checkpoint files), tokenizer excluded."""
    if stage.kind == "onnx":
        return sum(p.stat().st_size for p in stage.path.glob("model.onnx*"))
    return sum(p.stat().st_size for p in stage.path.iterdir() if p.suffix in (".safetensors", ".bin")) or dir_size_bytes(stage.path)


def evaluate_stages(stages, spec, heldout, settings, threads: int, log: Callable[[str], None], progress=None) -> dict:
    predictors = {stage.name: stage_predictor(stage, spec, threads) for stage in stages}
    outputs = {}
    for name, predictor in predictors.items():
        log(f"evaluating {name} on {len(heldout)} held-out rows")
        outputs[name] = predictor.predict(heldout.texts, heldout.text_pairs)
    baseline = outputs[stages[0].name]
    metrics = {name: score(spec.task, out, baseline, heldout.labels) for name, out in outputs.items()}

    texts, pairs = heldout.texts, heldout.text_pairs
    calls = {
        name: (lambda i, p=p: p([texts[i]], [pairs[i]] if pairs else None)) for name, p in predictors.items()
    }
    log(f"timing {len(calls)} stages interleaved at batch 1 ({settings.latency_rounds} rounds, {threads} threads)")
    report_progress = (lambda done, total: progress("latency", done, total)) if progress else None
    latency = run_interleaved(
        calls, len(texts), warmup=settings.warmup, iterations=settings.latency_rounds, seed=settings.seed,
        progress=report_progress,
    )
    speedup = compare(latency, stages[0].name)
    return {
        name: {
            "metrics": metrics[name],
            "latency": latency[name].to_dict(),
            "speedup": speedup[name],
            "size_bytes": model_bytes(stage),
        }
        for name, stage in zip(predictors, stages)
    }
