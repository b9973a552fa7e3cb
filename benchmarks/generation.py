"""What the KV cache buys: a GPT-2-small-shaped decoder generating with and without it, interleaved.

    python benchmarks/generation.py                          # GPT-2 small shapes, prompt 16, 128 new tokens
    python benchmarks/generation.py --rounds 2 --runners fp32,int8,pytorch --json gen.json
    python benchmarks/generation.py --work /tmp/gpt2s        # keep (and reuse) the model and its stages

Builds a random GPT-2 with GPT-2 small's shapes (12 layers, 768 wide, 12 heads, 1024 positions, a
50257-token LM head; the tokenizer is a 1000-token byte-level BPE trained on the vendored text, so
prompts are real text), runs xformopt's export (parity-checked at every decode step), fuse and
quantize passes on it, then times greedy generation of N tokens from a P-token prompt for every
runner with and without the cache, all in one interleaved run (see xformopt/decoder/bench.py).
Random weights are fine for speed (it depends only on shapes); quality needs a real checkpoint.
Never run as a test: speed claims live here and in `xformopt bench`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # toy_decoder: small decoders built in code

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads; see docs/guides/optimize.md, "How latency is measured"
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def stages(work: Path, args) -> dict[str, Path]:
    """Build (or reuse) the model and its export -> fuse -> quantize stages under ``work``."""
    from toy_decoder import build_decoder

    from xformopt.pipeline import run_single

    model = work / "model"
    if not (model / "config.json").is_file():
        log(f"building a random GPT-2 ({args.layers} layers, {args.hidden} wide, {args.heads} heads, vocab {args.vocab})")
        build_decoder(model, "gpt2", layers=args.layers, hidden=args.hidden, heads=args.heads, vocab_size=args.vocab,
                      context=args.context)
    chain = [("export", model, work / "export", {}), ("fuse", work / "export", work / "fused", {"select": "all"}),
             ("quantize", work / "fused", work / "int8", {"mode": "dynamic"})]
    for name, src, dst, options in chain:
        if (dst / "model.onnx").is_file():
            log(f"{name}: reusing {dst}")
            continue
        started = time.perf_counter()
        entry = run_single(name, str(src), dst, options)
        record = entry["record"]
        detail = {"export": lambda r: f"parity max|diff| {r['parity']['max_abs_diff']:.1e} over past lengths "
                                      f"{r['parity']['past_lengths'][:3]}..{r['parity']['past_lengths'][-1]}",
                  "fuse": lambda r: f"fused {({k: v for k, v in r['fused_kept'].items() if v})}",
                  "quantize": lambda r: f"{r['coverage']['int8']}/{r['coverage']['weighted_gemms']} GEMMs INT8 "
                                        f"{r['coverage']['int8_ops']}, logits cosine {r['agreement']['mean_agreement']:.4f}"}[name](record)
        log(f"{name}: {time.perf_counter() - started:.0f}s, {detail}")
    return {"pytorch": model, "fp32": work / "fused", "int8": work / "int8", "export": work / "export"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=50257, help="LM-head size (GPT-2's 50257)")
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--prompt", type=int, nargs="+", default=[16], help="prompt lengths in tokens")
    parser.add_argument("--new-tokens", type=int, nargs="+", default=[128], help="tokens generated per run")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (each runs every variant once)")
    parser.add_argument("--runners", default="pytorch,fp32,int8", help="comma-separated: pytorch, export, fp32 (fused), int8")
    parser.add_argument("--no-cache-runners", default=None, help="runners also timed without the cache [default: all]")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--work", type=Path, default=None, help="keep the model and stages here (reused when present)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--io-binding", action="store_true",
                        help="also time the cached fp32 and int8 runs with and without IO binding, interleaved")
    args = parser.parse_args()

    from toy_decoder import corpus

    from xformopt.decoder.bench import bench_generation
    from xformopt.measure.host import host_info, usable_cpus
    from xformopt.models import load_tokenizer
    from xformopt.report.generation import rows
    from xformopt.runtime.decoder import OrtDecoder, TorchDecoder

    threads = args.threads or usable_cpus()
    with tempfile.TemporaryDirectory(prefix="xformopt-genbench-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        dirs = stages(work, args)
        names = [n.strip() for n in args.runners.split(",") if n.strip()]
        runners = {n: TorchDecoder(dirs[n], threads=threads) if n == "pytorch" else OrtDecoder(dirs[n], threads=threads)
                   for n in names}
        tokenizer = load_tokenizer(dirs["pytorch"])
        log(f"load average {os.getloadavg()}; timing {', '.join(names)} with and without the cache, {threads} threads")
        started = time.perf_counter()
        doc = bench_generation(runners, tokenizer, corpus("test"), args.prompt, args.new_tokens, rounds=args.rounds,
                               warmup=1)
        if args.io_binding:
            plain = {f"{n} (no IO binding)": OrtDecoder(dirs[n], threads=threads, io_binding=False)
                     for n in ("fp32", "int8") if n in names}
            log("IO binding: cached generation with and without it, interleaved")
            doc["io_binding"] = bench_generation({**{n: runners[n] for n in ("fp32", "int8") if n in names}, **plain},
                                                 tokenizer, corpus("test"), args.prompt, args.new_tokens,
                                                 cache_modes=("cache",), rounds=max(args.rounds, 5), warmup=1)
        doc["seconds"] = round(time.perf_counter() - started, 1)
        doc["load_average_after"] = os.getloadavg()
        doc["model"] = {"family": "gpt2", "layers": args.layers, "hidden": args.hidden, "heads": args.heads,
                        "vocab": args.vocab, "context": args.context, "weights": "random (seeded)"}
        doc["host"] = host_info()
        doc["threads"] = threads
    header, body = rows(doc)
    widths = [max(len(h), *(len(r[i]) for r in body)) for i, h in enumerate(header)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    for r in body:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
    for cell in doc["cells"]:
        ratios = ", ".join(f"{n} {v:.1f}x" for n, v in cell["cache_speedup"].items())
        print(f"prompt {cell['prompt_tokens']}, {cell['new_tokens']} new tokens: with cache vs without (median total time): {ratios}")
    if "io_binding" in doc:
        for cell in doc["io_binding"]["cells"]:
            for name, modes in cell["results"].items():
                pt = modes["cache"]["per_token"]
                print(f"{name}: per-token p50 {pt['p50_ms']:.2f} ms, {modes['cache']['tokens_per_s']:.1f} tokens/s")
    print(f"({doc['seconds']:.0f}s, load average after {doc['load_average_after'][0]:.2f})")
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2, default=str) + "\n")


if __name__ == "__main__":
    from xformopt.logs import forwarded_to

    with forwarded_to(log):  # xformopt's own log lines, in this script's format
        main()
