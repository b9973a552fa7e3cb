"""Where one decode step's time goes, before and after issue 55, on an encoder-decoder INT8 artifact.

Before: the decoder graph as quantize wrote it until then (a tied LM head read transposed stayed float32) and the
search of the branch
point (commit ``BEFORE``: beam candidates ranked by a stable sort of beams x vocabulary). After: this tree.
Both generate exactly ``--tokens`` tokens from the same source, interleaved round by round.

Per step, in milliseconds (medians over rounds):
- ORT call: the Python call into ORT (``run`` / ``run_with_iobinding``), timed in the loop;
- of which operators: that call times the kernels' share of ORT's ``model_run`` in ORT's profiler (a separate
  profiled session on a step's real feed from the end of the output; profiling slows a run, so its own
  times are not subtracted from the unprofiled call); the rest of the call is ORT's framework, input and
  output binding;
- runner Python: the runner's ``step`` less the call into ORT;
- search Python: the search's own work per step (the sentence's time less start and steps, per step).

Run: python benchmarks/seq2seq_step_profile.py --artifact A --fused F --out benchmarks/results/seq2seq-step-profile
(``A``: a dynamic INT8 artifact, ``F``: the fuse stage it was quantized from).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

BEFORE = "1d9284d"  # the branch point of issue 55
ROOT = Path(__file__).resolve().parents[1]


def old_search():
    """xformopt/seq2seq/generate.py as it was at ``BEFORE``, as a module."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{BEFORE}:xformopt/seq2seq/generate.py"],
                            check=True, capture_output=True, text=True).stdout
    spec = importlib.util.spec_from_loader("generate_before", loader=None)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    exec(compile(source, "generate_before.py", "exec"), module.__dict__)
    return module


def before_artifact(artifact: Path, fused: Path, work: Path) -> Path:
    """``artifact`` with both graphs re-quantized from ``fused`` as before (no untied head), same formats."""
    from xformopt.passes.quantize.builders import quantize_dynamic_graph

    out = work / "before"
    if (out / "decoder.onnx").is_file():
        return out
    shutil.copytree(artifact, out, ignore=shutil.ignore_patterns("*.onnx", "*.onnx.data"))
    formats = json.loads((artifact / "manifest.json").read_text())["passes"][-1]["record"]["formats"]
    for graph in ("encoder.onnx", "decoder.onnx"):
        quantize_dynamic_graph(fused / graph, out / graph, formats, formats["op_types"], [])
    return out


class Timed:
    """The runner with its ``step`` and its calls into ORT timed."""

    def __init__(self, runner):
        self.runner = runner
        self.reset()
        session = runner.decoder
        for name in ("run", "run_with_iobinding"):
            setattr(session, name, self._timed(getattr(session, name), "call_s"))
        self._step = runner.step

    def reset(self) -> None:
        self.step_s, self.call_s, self.steps = 0.0, 0.0, 0

    def _timed(self, fn, field):
        def call(*args, **kwargs):
            started = time.perf_counter()
            out = fn(*args, **kwargs)
            setattr(self, field, getattr(self, field) + time.perf_counter() - started)
            return out
        return call

    def start(self, *args):
        return self.runner.start(*args)

    def step(self, tokens, cache):
        started = time.perf_counter()
        out = self._step(tokens, cache)
        self.step_s += time.perf_counter() - started
        self.steps += 1
        self.last_feed = (tokens, cache)
        return out


def variant(path: Path, threads: int):
    from xformopt.seq2seq.runner import OrtSeq2Seq

    return OrtSeq2Seq(path, threads)  # both through ``run``: IO binding measured slower (docs/seq2seq.md)


def operators(path: Path, threads: int, feed: dict, runs: int = 20) -> tuple[float, float]:
    """(sum of kernel times, ORT's model_run) per run, ms, medians, from ORT's profiler."""
    from xformopt.runtime.session import ort_session

    session = ort_session(path / "decoder.onnx", threads, profile_prefix=str(path / "profile"))
    for _ in range(runs):
        session.run(None, feed)
    trace = session.end_profiling()
    events = json.loads(Path(trace).read_text())
    os.remove(trace)
    runs_ = [e for e in events if e.get("cat") == "Session" and e["name"] == "model_run"][3:]
    kernels = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    per_run = [sum(e["dur"] for e in kernels if r["ts"] <= e["ts"] <= r["ts"] + r["dur"]) for r in runs_]
    return float(np.median(per_run)) / 1e3, float(np.median([r["dur"] for r in runs_])) / 1e3


def one_round(timed: Timed, search, settings, ids, mask, tokens: int) -> dict:
    timed.reset()
    started = time.perf_counter()
    search.generate(timed, ids, mask, settings)
    total = time.perf_counter() - started
    steps = timed.steps
    return {"per_token_ms": total / tokens * 1e3, "step_ms": timed.step_s / steps * 1e3,
            "call_ms": timed.call_s / steps * 1e3, "outside_steps_s": total - timed.step_s,  # start + search
            "steps": steps, "timed": timed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--artifact", type=Path, required=True)
    parser.add_argument("--fused", type=Path, required=True)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--beams", default="1,4")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    from xformopt.seq2seq import generate as search_after
    from xformopt.seq2seq.generate import GenerationSettings

    args.out.mkdir(parents=True, exist_ok=True)
    paths = {"before": before_artifact(args.artifact, args.fused, args.out / "work"), "after": args.artifact}
    searches = {"before": old_search(), "after": search_after}
    ids = np.array([[4 + (i * 7) % 20 for i in range(12)] + [1]], dtype=np.int64)
    mask = np.ones_like(ids)
    rows = []
    for threads in (int(t) for t in args.threads.split(",")):
        runners = {name: variant(paths[name], threads) for name in paths}
        timers = {name: Timed(runner) for name, runner in runners.items()}
        for beams in (int(b) for b in args.beams.split(",")):
            settings = GenerationSettings.from_model_dir(args.artifact).with_(
                max_new_tokens=args.tokens, min_new_tokens=args.tokens, num_beams=beams, early_stopping=False)
            start_ms = {}
            for name, runner in runners.items():  # warm-up, and the start's own time
                searches[name].generate(runner, ids, mask, settings)
                began = time.perf_counter()
                runner.start(ids, mask)
                start_ms[name] = (time.perf_counter() - began) * 1e3
            got = {name: [] for name in runners}
            for _ in range(args.rounds):
                for name in runners:
                    got[name].append(one_round(timers[name], searches[name], settings, ids, mask, args.tokens))
            for name, rounds in got.items():
                rows.append(summarise(name, threads, beams, rounds, start_ms[name], paths[name]))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    write(args.out, rows)


def summarise(name: str, threads: int, beams: int, rounds: list[dict], start_ms: float, path: Path) -> dict:
    def med(key):
        return float(np.median([r[key] for r in rounds]))

    steps = rounds[0]["steps"]
    tokens, cache = rounds[-1]["timed"].last_feed
    feed = rounds[-1]["timed"].runner.decoder_feed(tokens, cache)
    ops, model_run = operators(path, threads, feed)
    search = float(np.median([(r["outside_steps_s"] * 1e3 - start_ms) / steps for r in rounds]))
    call = med("call_ms")
    return {"variant": name, "threads": threads, "beams": beams, "tokens_per_s": 1e3 / med("per_token_ms"),
            "per_token_ms": med("per_token_ms"), "ort_call_ms": call, "operators_ms": call * ops / model_run,
            "ort_framework_and_binding_ms": call * (1 - ops / model_run), "profiled_operators_ms": ops,
            "profiled_model_run_ms": model_run, "runner_python_ms": med("step_ms") - call,
            "search_python_ms": search, "start_ms": start_ms}


def write(out: Path, rows: list[dict]) -> None:
    from xformopt.measure.host import cpu_model

    (out / "results.json").write_text(json.dumps({"cpu": cpu_model(), "rows": rows}, indent=1) + "\n")
    lines = ["| variant | threads | beams | tokens/s | ms/token | ORT call | of which operators | ORT framework + binding | "
             "runner Python | search Python |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['variant']} | {r['threads']} | {r['beams']} | {r['tokens_per_s']:.0f} | {r['per_token_ms']:.1f} | "
                     f"{r['ort_call_ms']:.1f} | {r['operators_ms']:.1f} | {r['ort_framework_and_binding_ms']:.1f} | "
                     f"{r['runner_python_ms']:.2f} | {r['search_python_ms']:.1f} |")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
