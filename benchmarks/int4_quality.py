"""4-bit quality side by side: ONNX Runtime's MatMulNBits quantizer (RTN, HQQ, GPTQ) against Intel
Neural Compressor 3.x weight-only (RTN, AWQ, GPTQ on the torch model) at equal bits and group size.

A small Qwen2-architecture decoder (grouped-query attention) is trained briefly on the vendored
train split, then every variant's perplexity is scored on the same held-out texts (the vendored
test split). ORT variants go through xformopt (export, ``quantize --mode int4``) and are scored by
xformopt's ONNX runner; INC variants are scored in PyTorch after ``prepare``/``convert`` (INC's
packed ``WeightOnlyLinear`` modules), since a winner would then have to be packed into
MatMulNBits: only worth building if one wins.

    python benchmarks/int4_quality.py --layers 4 --hidden 128 --train-steps 300 --group 128
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--train-steps", type=int, default=300)
    parser.add_argument("--group", type=int, default=128)
    parser.add_argument("--texts", type=int, default=200)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    import torch
    from conftest import make_ctx, run_pass
    from transformers import AutoModelForCausalLM, Qwen2Config

    from xformopt.decoder.perplexity import load_token_lists, perplexity
    from xformopt.decoder.runtime import OrtDecoder, TorchDecoder
    from xformopt.decoder.toy import build_decoder, corpus
    from xformopt.models import load_tokenizer

    root = Path(tempfile.mkdtemp(prefix="xformopt-int4-quality-"))

    def make(vocab, eos):
        return Qwen2Config(vocab_size=vocab, hidden_size=args.hidden, intermediate_size=3 * args.hidden,
                           num_hidden_layers=args.layers, num_attention_heads=8, num_key_value_heads=2,
                           max_position_embeddings=128, tie_word_embeddings=False, bos_token_id=eos, eos_token_id=eos)

    started = time.perf_counter()
    model_dir = build_decoder(root / "m", "qwen2", make_config=make, train_steps=args.train_steps, train_batch=16)
    print(f"trained {args.train_steps} steps in {time.perf_counter() - started:.0f}s", file=sys.stderr)
    tokenizer = load_tokenizer(model_dir)
    lists, source = load_token_lists(None, tokenizer, 128, limit=args.texts)
    results: dict[str, dict] = {}
    base = perplexity(TorchDecoder(model_dir), lists)["value"]
    results["pytorch fp32"] = {"perplexity": base}

    ctx = make_ctx(model_dir, corpus("test")[:48])
    run_pass("export", ctx, model_dir, root / "e")
    for algo in ("rtn", "hqq", "gptq"):
        out = root / f"ort-{algo}"
        started = time.perf_counter()
        run_pass("quantize", ctx, root / "e", out, mode="int4", algorithm=algo, block_size=args.group, symmetric=True,
                 calibration_limit=64)
        results[f"ORT {algo}"] = {"perplexity": perplexity(OrtDecoder(out), lists)["value"],
                                  "seconds": round(time.perf_counter() - started, 1)}

    calib = [torch.tensor([ids]) for ids in load_token_lists(None, tokenizer, 128, limit=64, seed=1)[0]]
    try:
        from neural_compressor.torch.quantization import AWQConfig, GPTQConfig, RTNConfig, convert, prepare

        configs = {
            "INC RTN": RTNConfig(bits=4, group_size=args.group, use_sym=True),
            "INC AWQ": AWQConfig(bits=4, group_size=args.group, use_sym=True),
            "INC GPTQ": GPTQConfig(bits=4, group_size=args.group, use_sym=True),
        }
        float_model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
        for name, config in configs.items():
            started = time.perf_counter()
            try:
                kwargs = {"example_inputs": calib[0]} if name == "INC AWQ" else {}
                model = prepare(copy.deepcopy(float_model), config, **kwargs)
                if name != "INC RTN":
                    with torch.no_grad():
                        for ids in calib:
                            model(ids)
                model = convert(model)
                results[name] = {"perplexity": perplexity(TorchDecoder(model=model), lists)["value"],
                                 "seconds": round(time.perf_counter() - started, 1)}
            except Exception as exc:  # a failed INC algorithm is a result too
                results[name] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    except ImportError as exc:
        results["INC"] = {"error": f"ImportError: {exc}"}

    print(f"\n4 bits, group {args.group}, symmetric; perplexity on {len(lists)} texts of {source}")
    print("| variant | perplexity | vs fp32 | quantize s |\n|---|---|---|---|")
    for name, row in results.items():
        if "error" in row:
            print(f"| {name} | failed: {row['error']} | | |")
        else:
            print(f"| {name} | {row['perplexity']:.3f} | {row['perplexity'] / base - 1:+.2%} | {row.get('seconds', '')} |")
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": None}, "results": results}, indent=1, default=str))


if __name__ == "__main__":
    main()
