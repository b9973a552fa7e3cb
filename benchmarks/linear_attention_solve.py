"""Qwen3.5's linear-attention solve exported two ways, on one tiny model built in code: as ONNX Loops
(xformopt/passes/export/triangular_solve.py, the default) and as transformers' unrolled export form. Both
graphs are then timed interleaved in one run.

    python benchmarks/linear_attention_solve.py --rounds 15 --json out.json

Prints, per form: the export's seconds, the graph's node and Loop counts, parity with PyTorch (max |diff|
over prompts of 5, 64, 65 and 130 tokens, greedy mismatches), and the median latency of a 128-token
prefill and of one decode step, with the host.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tiny model builders


def export(model_dir: Path, dst: Path, loops: bool) -> dict:
    import onnx

    from xformopt.passes.export import decoder_dynamo
    from xformopt.passes.export.decoder import copy_config_files

    dst.mkdir(parents=True)
    original = decoder_dynamo.loop_solves
    if not loops:
        decoder_dynamo.loop_solves = lambda model: contextlib.nullcontext({})
    started = time.perf_counter()
    try:
        note = decoder_dynamo.export_dynamo_decoder(model_dir, dst, 18)
    finally:
        decoder_dynamo.loop_solves = original
    seconds = time.perf_counter() - started
    copy_config_files(model_dir, dst)
    graph = onnx.load(dst / "model.onnx", load_external_data=False).graph
    return {"export_s": round(seconds, 1), "nodes": len(graph.node),
            "loops": sum(n.op_type == "Loop" for n in graph.node), "note": note}


def parity(model_dir: Path, stage: Path) -> dict:
    import numpy as np

    from xformopt.passes.export.decoder import check_decoder_parity
    from xformopt.runtime.decoder import OrtDecoder, TorchDecoder

    rng = np.random.default_rng(0)
    prompts = [[int(x) for x in rng.integers(3, 200, n)] for n in (5, 64, 65, 130)]
    record = check_decoder_parity(TorchDecoder(model_dir, threads=2), OrtDecoder(stage, threads=2), prompts, steps=4)
    return {"max_abs_diff": record["max_abs_diff"], "greedy_argmax_mismatches": record["greedy_argmax_mismatches"]}


def timed(stages: dict[str, Path], rounds: int, threads: int) -> dict:
    import numpy as np

    from xformopt.runtime.decoder import OrtDecoder

    runners = {name: OrtDecoder(path, threads=threads) for name, path in stages.items()}
    prompt = np.random.default_rng(1).integers(3, 200, (1, 128)).astype(np.int64)
    times = {name: {"prefill_128": [], "decode_step": []} for name in stages}
    for _ in range(rounds):  # interleaved: each round runs every form
        for name, runner in runners.items():
            started = time.perf_counter()
            logits, state = runner.forward(prompt)
            times[name]["prefill_128"].append(time.perf_counter() - started)
            token = logits[:, -1].argmax(-1)[:, None]
            for _ in range(8):
                started = time.perf_counter()
                logits, state = runner.forward(token, state)
                times[name]["decode_step"].append(time.perf_counter() - started)
                token = logits[:, -1].argmax(-1)[:, None]
    return {name: {what: {"median_ms": round(statistics.median(v) * 1e3, 3), "n": len(v)} for what, v in kinds.items()}
            for name, kinds in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds (a prefill and 8 steps each)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    import tiny_decoders

    from xformopt.measure import host

    root = Path(tempfile.mkdtemp(prefix="xformopt-solve-"))
    model_dir = tiny_decoders.build(root / "model", "qwen3_5_text", seed=3)
    forms = {"loop": True, "unrolled": False}
    results = {name: export(model_dir, root / name, loops) for name, loops in forms.items()}
    for name in forms:
        results[name]["parity"] = parity(model_dir, root / name)
    latency = timed({name: root / name for name in forms}, args.rounds, args.threads)
    for name in forms:
        results[name]["latency"] = latency[name]
    doc = {"host": host.cpu_model(), "threads": args.threads, "rounds": args.rounds, "forms": results}
    for name, r in results.items():
        lat = r["latency"]
        print(f"{name:9s} export {r['export_s']:6.1f} s  nodes {r['nodes']:5d}  Loops {r['loops']}  "
              f"parity {r['parity']['max_abs_diff']:.1e} ({r['parity']['greedy_argmax_mismatches']} mismatches)  "
              f"prefill 128 {lat['prefill_128']['median_ms']:.3f} ms  step {lat['decode_step']['median_ms']:.3f} ms")
    print(f"host: {doc['host']}, {args.threads} threads, {args.rounds} interleaved rounds")
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
