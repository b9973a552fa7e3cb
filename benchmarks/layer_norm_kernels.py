"""ONNX Runtime's CPU SkipLayerNormalization against the same math as Sum + LayerNormalization (fuse's
``*_split_norms`` candidates, xformopt/passes/fuse/split_norms.py).

1. Kernels: one node, or the pair, at encoder shapes (batch 1; hidden 384/768/1024; 8, 32, 128 tokens), 1 and 2
   threads, interleaved rounds, median microseconds per call (the call's own cost included, as in a graph it is
   not). ``Add + LayerNormalization`` is timed as ORT loads it: its SkipLayerNormFusion turns it back into the
   fused node, which is why the split writes a Sum.
2. Artifacts (``--artifact DIR``, repeatable): each artifact against the same graph with its SkipLayerNormalizations
   split (fuse's own ``split_candidate``), model call only, batch 1, on the vendored movie test texts tokenized by the
   artifact's own tokenizer, interleaved, 2 threads; with the largest output difference.

Run: python benchmarks/layer_norm_kernels.py [--artifact OUT ...] --json benchmarks/results/layer-norm-kernels/run.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from xformopt import no_telemetry  # noqa: E402,F401  (before onnxruntime)

SHAPES = [(h, t) for h in (384, 768, 1024) for t in (8, 32, 128)]
MS = "com.microsoft"


def _norm_graph(kind: str, hidden: int) -> bytes:
    from onnx import TensorProto, helper
    from onnx import numpy_helper as nh

    rng = np.random.default_rng(0)
    inits = [nh.from_array((rng.standard_normal(hidden) * 0.3 + 1).astype(np.float32), "gamma"),
             nh.from_array(rng.standard_normal(hidden).astype(np.float32), "beta"),
             nh.from_array(rng.standard_normal(hidden).astype(np.float32), "bias")]
    nodes = {
        "SkipLayerNormalization": [helper.make_node("SkipLayerNormalization", ["x", "skip", "gamma", "beta", "bias"],
                                                    ["y"], domain=MS, epsilon=1e-5)],
        "Sum + LayerNormalization": [helper.make_node("Sum", ["x", "skip", "bias"], ["s"]),
                                     helper.make_node("LayerNormalization", ["s", "gamma", "beta"], ["y"], axis=-1,
                                                      epsilon=1e-5)],
        "Add + LayerNormalization (ORT re-fuses it at load)": [
            helper.make_node("Add", ["x", "bias"], ["a"]), helper.make_node("Add", ["a", "skip"], ["s"]),
            helper.make_node("LayerNormalization", ["s", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-5)],
    }[kind]
    graph = helper.make_graph(
        nodes, "norm", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, "s", hidden]) for n in ("x", "skip")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "s", hidden])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(MS, 1)]).SerializeToString()


KINDS = ("SkipLayerNormalization", "Sum + LayerNormalization", "Add + LayerNormalization (ORT re-fuses it at load)")


def kernels(rounds: int, calls: int) -> list[dict]:
    from xformopt.runtime.session import ort_session

    rows = []
    for threads in (1, 2):
        for hidden, tokens in SHAPES:
            rng = np.random.default_rng(1)
            feed = {n: (rng.standard_normal((1, tokens, hidden)) * 3).astype(np.float32) for n in ("x", "skip")}
            sessions = {k: ort_session(_norm_graph(k, hidden), threads) for k in KINDS}
            outs = {k: s.run(None, feed)[0] for k, s in sessions.items()}
            times: dict[str, list[float]] = {k: [] for k in KINDS}
            for r in range(rounds):
                for k in (KINDS if r % 2 else KINDS[::-1]):
                    run = sessions[k].run
                    start = time.perf_counter()
                    for _ in range(calls):
                        run(None, feed)
                    times[k].append((time.perf_counter() - start) / calls * 1e6)
            med = {k: float(np.median(v)) for k, v in times.items()}
            row = {"threads": threads, "hidden": hidden, "tokens": tokens, "median_us": med,
                   "fused_over_split": med[KINDS[0]] / med[KINDS[1]],
                   "max_abs_diff": float(max(np.abs(outs[k] - outs[KINDS[0]]).max() for k in KINDS))}
            print(f"{threads} thread(s) hidden {hidden} x {tokens} tokens: "
                  + ", ".join(f"{k.split(' (')[0]} {v:.1f} us" for k, v in med.items())
                  + f"; fused/split {row['fused_over_split']:.2f}x", file=sys.stderr)
            rows.append(row)
    return rows


def _texts(limit: int) -> list[str]:
    from xformopt.resources import vader_split_path

    return [json.loads(line)["text"] for line in vader_split_path("test").read_text().splitlines()[:limit]]


def artifact(path: Path, rounds: int, texts: int) -> dict:
    """``path`` against its norms split as fuse splits them (``split_candidate``), timed as ``benchmarks/artifacts.py
    --model-only`` times (``measure.modes.model_call``): each text tokenized once, only the model call timed."""
    from xformopt.measure.modes import model_call
    from xformopt.passes.fuse.run import split_candidate
    from xformopt.runtime.encoder import OrtPredictor
    from xformopt.runtime.predictor import artifact_spec

    spec, sample = artifact_spec(path), _texts(texts)
    with tempfile.TemporaryDirectory() as scratch:
        split_dir = Path(scratch) / "split"
        split, _ = split_candidate(path, split_dir)
        predictors = {"as written": OrtPredictor(spec, path, threads=2),
                      "norms split": OrtPredictor(spec, split_dir, threads=2)}
        encoded = [predictors["as written"].tokenize([t]) for t in sample]
        diff = max(float(np.abs(predictors["as written"].raw_outputs(e) - predictors["norms split"].raw_outputs(e)).max())
                   for e in encoded)
        stats = model_call(predictors, sample, None, rounds=rounds * len(sample), warmup=20)
    med = {k: s.median_ms for k, s in stats.items()}
    row = {"artifact": str(path), "split": split, "median_ms": med, "p90_ms": {k: s.p90_ms for k, s in stats.items()},
           "speedup": med["as written"] / med["norms split"], "max_abs_diff_first_output": diff,
           "mean_tokens": float(np.mean([e["input_ids"].shape[1] for e in encoded]))}
    print(f"{path}: {split} split; {med['as written']:.3f} -> {med['norms split']:.3f} ms ({row['speedup']:.2f}x), "
          f"max |diff| {diff:.2e}", file=sys.stderr)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifact", type=Path, action="append", default=[], help="an artifact folder (model.onnx)")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds")
    parser.add_argument("--calls", type=int, default=200, help="kernel calls per round")
    parser.add_argument("--texts", type=int, default=100, help="held-out texts per artifact round")
    parser.add_argument("--skip-kernels", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    import onnxruntime

    from xformopt.measure.host import host_info

    result = {"host": host_info(), "onnxruntime": onnxruntime.__version__,
              "kernels": [] if args.skip_kernels else kernels(args.rounds, args.calls),
              "artifacts": [artifact(a, args.rounds, args.texts) for a in args.artifact]}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    print(json.dumps({"kernels": result["kernels"], "artifacts": result["artifacts"]}, indent=1))


if __name__ == "__main__":
    main()
