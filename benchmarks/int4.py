"""4-bit weight-only decoding on CPU: one cached decode step, side by side, interleaved.

A Qwen2-architecture decoder with grouped-query attention at ~150M-parameter shapes (random weights,
seeded: speed depends only on shapes) goes through xformopt's own CLI (`export`, then
`xformopt int4`) and is timed against:

- ``pytorch``: transformers eager fp32 with its KV cache (DynamicCache), ``logits_to_keep=1``;
- ``dynamo-fp32``: the dynamo decoder export, unfused (what a family without the genai builder starts from;
  optimum, which this variant used to be, does not install beside transformers 5);
- ``export-fp32``: xformopt's fp32 export (onnxruntime-genai's builder: GroupQueryAttention);
- ``int4``: xformopt's int4 artifact (MatMulNBits, RTN, block 32, symmetric, accuracy_level 4),
  decoding into one shared KV buffer per layer (GroupQueryAttention's past_present_share_buffer);
- ``int4-copy``: the same artifact and runner with the shared buffer off (``share_buffer=False``):
  ORT writes a new present (past + token) every step, as before; the pair isolates the copy's cost;
- ``genai-int4``: onnxruntime-genai's own builder at ``-p int4 -e cpu`` (its defaults), run by
  xformopt's runtime like the others.

Every variant runs one cached decode step (one new token after a prompt of P tokens, prefilled once,
untimed), round by round in a shuffled order, so drift hits all alike. Medians and ratios, load
average, host model and the avx512_vnni flag are printed; ``--json`` writes the whole record.

    python benchmarks/int4.py                       # 12 layers, hidden 768, 12/2 heads, FFN 3072, vocab 32000
    python benchmarks/int4.py --rounds 30 --prompt 32 256 768 --memory --json int4.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # toy_decoder: small decoders built in code
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

SHAPES = dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12, num_key_value_heads=2,
              intermediate_size=3072, vocab_size=32000, max_position_embeddings=1024, tie_word_embeddings=False)


def host() -> dict:
    model = next((line.split(":", 1)[1].strip() for line in subprocess.run(["lscpu"], capture_output=True, text=True)
                  .stdout.splitlines() if line.startswith("Model name")), platform.processor())
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return {"cpu": model, "avx512_vnni": " avx512_vnni" in flags, "cores_usable": len(os.sched_getaffinity(0)),
            "load_average": list(os.getloadavg())}


def cli(*args: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "xformopt.cli.app", *args], check=True, env=env, stdout=subprocess.DEVNULL)
    print(f"  xformopt {args[0]}: {time.perf_counter() - started:.0f}s", file=sys.stderr)


def build(root: Path, seed: int) -> Path:
    from toy_decoder import build_decoder
    from transformers import Qwen2Config

    def make(vocab, eos):
        return Qwen2Config(**{**SHAPES, "vocab_size": vocab}, bos_token_id=eos, eos_token_id=eos)

    return build_decoder(root / "qwen2-150m", "qwen2", vocab_size=SHAPES["vocab_size"], context=SHAPES["max_position_embeddings"],
                         seed=seed, make_config=make)


def genai_int4(src: Path, dst: Path) -> None:
    import contextlib

    from onnxruntime_genai.models import builder

    from xformopt.passes.export.decoder import copy_config_files, pin_head_dim

    with tempfile.TemporaryDirectory() as cache, contextlib.redirect_stdout(sys.stderr):
        extra = builder.parse_extra_options(None, str(src), str(dst), "int4", "cpu", cache, [])
        builder.create_model(None, str(src), str(dst), "int4", "cpu", cache, **extra)
    pin_head_dim(dst / "model.onnx", src)
    copy_config_files(src, dst)


def dynamo_fp32(src: Path, dst: Path) -> None:
    from xformopt.passes.export.decoder import copy_config_files
    from xformopt.passes.export.decoder_dynamo import export_dynamo_decoder

    dst.mkdir(parents=True)
    export_dynamo_decoder(src, dst, 18)
    copy_config_files(src, dst)


def graph_facts(path: Path) -> dict:
    import onnx

    from xformopt.passes.int4.run import nbits_counts

    model = onnx.load(path / "model.onnx", load_external_data=False)
    attrs = {}
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            attrs = {a.name: a.i for a in node.attribute if a.name in ("block_size", "accuracy_level", "bits")}
            break
    ops = [n.op_type for n in model.graph.node]
    return {"size_mb": round(sum(p.stat().st_size for p in path.glob("model.onnx*")) / 1e6, 1), **nbits_counts(model),
            "GroupQueryAttention": ops.count("GroupQueryAttention"), "MatMul_float": ops.count("MatMul"),
            "first_matmulnbits": attrs}


MEMORY_PROBE = """
import sys, numpy as np
sys.path.insert(0, {root!r})
from xformopt.runtime.decoder import OrtDecoder, TorchDecoder
kind, path = sys.argv[1], sys.argv[2]
runner = (TorchDecoder(path, threads=2) if kind == "pytorch"
          else OrtDecoder(path, threads=2, share_buffer=False if kind == "int4-copy" else None))
logits, state = runner.forward(np.arange(1, 257, dtype=np.int64)[None])
for _ in range(16):
    logits, state = runner.forward(logits[:, -1:].argmax(-1), state, last_only=True)
# VmHWM, not ru_maxrss: Linux keeps ru_maxrss across fork+exec, so it would report the parent's peak.
print(next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")) / 1024)
"""


def peak_memory_mb(kind: str, path: Path) -> float:
    """Peak resident memory of a fresh process that loads the variant, prefills 256 tokens and
    decodes 16 (one process per variant: peaks do not mix)."""
    out = subprocess.run([sys.executable, "-c", MEMORY_PROBE.format(root=str(ROOT)), kind, str(path)],
                         capture_output=True, text=True, check=True)
    return round(float(out.stdout.strip().splitlines()[-1]), 1)


def op_profile(path: Path, prompts: list[int], threads: int, steps: int = 12) -> dict:
    """Kernel time per op type in one cached decode step (ORT's profiler, prefill excluded): where
    a step's time goes, and which ops grow with the context."""
    import collections

    import onnxruntime as ort

    from xformopt.runtime.decoder import OrtDecoder

    out = {}
    for prompt_len in prompts:
        options = ort.SessionOptions()
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(tempfile.mkdtemp()) / "ort")
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        for key in ("session.intra_op.allow_spinning", "session.inter_op.allow_spinning"):
            options.add_session_config_entry(key, "0")
        runner = OrtDecoder(path, threads=threads)
        runner.session = ort.InferenceSession(str(path / "model.onnx"), options, providers=["CPUExecutionProvider"])
        prompt = np.random.default_rng(0).integers(1, 900, size=(1, prompt_len))
        _, state = runner.forward(prompt)
        for _ in range(steps):
            runner.forward(prompt[:, -1:], state, last_only=True)
        events = json.loads(Path(runner.session.end_profiling()).read_text())
        runs = [e for e in events if e.get("name") == "model_run"]
        prefill_end = runs[0]["ts"] + runs[0]["dur"]
        per_op = collections.Counter()
        for e in events:
            if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] > prefill_end:
                per_op[e["args"]["op_name"]] += e["dur"] / 1e3 / steps
        out[prompt_len] = {"step_ms": float(np.median([r["dur"] for r in runs[1:]]) / 1e3),
                           "op_ms": {k: round(v, 3) for k, v in per_op.most_common(4)},
                           "load_average": os.getloadavg()[0]}
        print(f"  profile {path.name} prompt {prompt_len}: step {out[prompt_len]['step_ms']:.1f} ms, "
              + ", ".join(f"{k} {v:.2f}" for k, v in out[prompt_len]["op_ms"].items()), file=sys.stderr)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--prompt", type=int, nargs="+", default=[32, 256])
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--workdir", type=Path, default=None, help="keep the models here (default: a temp dir)")
    parser.add_argument("--skip", nargs="*", default=[], help="variants to leave out")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--memory", action="store_true", help="also measure each variant's peak RSS in its own process")
    parser.add_argument("--profile", action="store_true", help="also profile the int4 step per op type (ORT's profiler)")
    args = parser.parse_args()

    from xformopt.measure.latency import run_interleaved
    from xformopt.runtime.decoder import OrtDecoder, TorchDecoder

    root = args.workdir or Path(tempfile.mkdtemp(prefix="xformopt-int4-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    model = root / "qwen2-150m"
    if not (model / "config.json").exists():
        build(root, 0)
    params = sum(np.prod(v.shape) for v in __import__("safetensors.numpy", fromlist=["load_file"]).load_file(
        model / "model.safetensors").values())
    print(f"model: {params / 1e6:.0f}M parameters, {json.dumps(SHAPES)}", file=sys.stderr)
    dirs = {"export-fp32": root / "e", "int4": root / "q4", "genai-int4": root / "genai-int4", "dynamo-fp32": root / "dynamo"}
    if not dirs["export-fp32"].exists():
        cli("export", str(model), "-o", str(dirs["export-fp32"]))
    if not dirs["int4"].exists():
        cli("int4", str(dirs["export-fp32"]), "-o", str(dirs["int4"]))
    if "genai-int4" not in args.skip and not dirs["genai-int4"].exists():
        genai_int4(model, dirs["genai-int4"])
    if "dynamo-fp32" not in args.skip and not dirs["dynamo-fp32"].exists():
        dynamo_fp32(model, dirs["dynamo-fp32"])

    runners = {"pytorch": TorchDecoder(model, threads=args.threads)}
    runners.update({name: OrtDecoder(d, threads=args.threads) for name, d in dirs.items() if name not in args.skip})
    if "int4-copy" not in args.skip:
        runners["int4-copy"] = OrtDecoder(dirs["int4"], threads=args.threads, share_buffer=False)
    runners = {k: v for k, v in runners.items() if k not in args.skip}
    facts = {name: graph_facts(d) for name, d in dirs.items() if name in runners}
    if args.memory:
        for name in runners:
            path = model if name == "pytorch" else dirs.get(name, dirs["int4"])
            facts.setdefault(name, {})["peak_rss_mb"] = peak_memory_mb(name, path)
            print(f"  {name}: peak RSS {facts[name]['peak_rss_mb']:.0f} MB", file=sys.stderr)
    rng = np.random.default_rng(0)
    cells = []
    for prompt_len in args.prompt:
        prompt = rng.integers(1, 900, size=(1, prompt_len))
        token = prompt[:, -1:]
        states = {name: r.forward(prompt)[1] for name, r in runners.items()}
        calls = {name: (lambda i, r=r, s=states[name]: r.forward(token, s, last_only=True)) for name, r in runners.items()}
        load = os.getloadavg()[0]
        stats = run_interleaved(calls, 1, warmup=args.warmup, iterations=args.rounds)
        medians = {name: s.median_ms for name, s in stats.items()}
        cell = {"prompt_tokens": prompt_len, "median_ms": medians, "p90_ms": {n: s.p90_ms for n, s in stats.items()},
                "load_average_before": load,
                "int4_speedup_vs": {name: medians[name] / medians["int4"] for name in medians if name != "int4"}}
        cells.append(cell)
        print(f"\nprompt {prompt_len} tokens, one cached decode step, median ms (p90), {args.rounds} interleaved rounds, "
              f"{args.threads} threads, load {load:.2f}")
        for name in medians:
            ratio = f"int4 is {cell['int4_speedup_vs'][name]:.2f}x faster" if name != "int4" else ""
            print(f"  {name:13s} {medians[name]:8.2f} ({stats[name].p90_ms:.2f})  {ratio}")
    profile = op_profile(dirs["int4"], args.prompt, args.threads) if args.profile else None
    record = {"host": host(), "shapes": SHAPES, "parameters": int(params), "threads": args.threads, "rounds": args.rounds,
              "graphs": facts, "cells": cells,
              **({"int4_op_profile": profile} if profile else {})}
    print(json.dumps({"host": record["host"], "graphs": facts}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
