"""4-bit quality side by side: ONNX Runtime's MatMulNBits quantizer (RTN, HQQ, GPTQ) against Intel
Neural Compressor 3.x weight-only (RTN, AWQ, GPTQ on the torch model) at equal bits and group size.

A small Qwen2-architecture decoder (grouped-query attention) is trained briefly on the vendored
train split, then every variant's perplexity is scored on the same held-out texts (the vendored
test split). ORT variants go through xformopt (export, ``xformopt int4``) and are scored by
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


# onnxruntime-genai builder MatMul name -> the torch Linear(s) whose weights it holds (q, k, v concatenated).
def _modules_for(node_name: str) -> list[str]:
    import re

    if node_name == "/lm_head/MatMul":
        return ["lm_head"]
    m = re.fullmatch(r"/model/layers\.(\d+)/(attn|mlp)/(\w+)/MatMul", node_name)
    if not m:
        return []
    layer, block, proj = m.groups()
    if proj == "qkv_proj":
        return [f"model.layers.{layer}.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj")]
    return [f"model.layers.{layer}.{'self_attn' if block == 'attn' else 'mlp'}.{proj}"]


def pack_inc_into_matmulnbits(inc_model, float_model, model_dir: Path, ctx, work: Path, group: int, level: int) -> tuple[Path, dict]:
    """INC's 4-bit integers and scales written as MatMulNBits (no re-quantization): the dequantized
    weights go through xformopt's export, then each MatMul is replaced by MatMulNBits carrying INC's
    own ints (stored as q + 8, the op's default zero point) and scales."""
    import numpy as np
    import onnx
    import torch
    from helpers import run_pass
    from onnx import helper, numpy_helper

    from xformopt.passes.export.decoder import copy_config_files
    from xformopt.passes.int4.run import build_candidate

    ints: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    deq = copy.deepcopy(float_model)
    state = {k: v for k, v in inc_model.state_dict().items()}
    deq_state = deq.state_dict()
    for name, module in inc_model.named_modules():
        if hasattr(module, "unpack") and hasattr(module, "scales"):
            if name.endswith(".linear"):  # AWQ's MulLinear: its channel scales stay a separate Mul
                raise RuntimeError(f"{name}: INC kept AWQ's input-channel scales in a wrapper (no absorb layer found); "
                                   "packing those needs the Mul in the graph too")
            params = module.unpack()  # optimum format: unsigned ints with a zero point (8 when symmetric)
            zp = params.get("zp")
            codes = params["int_weight"].to(torch.int32).numpy()
            zero = zp.to(torch.int32).numpy().repeat(group, axis=1)[:, : codes.shape[1]] if zp is not None else 0
            q = codes - zero
            assert zp is None or bool((zp == 8).all()), f"{name}: asymmetric zero points"
            assert q.min() >= -8 and q.max() <= 7, f"{name}: outside 4-bit range"
            scales = params["scales"].float().numpy()
            ints[name] = (q, scales)
            deq_state[f"{name}.weight"] = torch.from_numpy(q * np.repeat(scales, group, axis=1)[:, : q.shape[1]]).float()
            if params.get("bias") is not None and f"{name}.bias" in deq_state:  # INC adds zero biases elsewhere
                deq_state[f"{name}.bias"] = params["bias"].float()
    for key, value in state.items():  # norms and anything else INC changed (AWQ absorbs scales into them)
        if key in deq_state and deq_state[key].shape == value.shape and value.dtype.is_floating_point:
            if not any(key.startswith(f"{n}.") for n in ints):
                deq_state[key] = value.float()
    deq.load_state_dict(deq_state)
    deq_dir = work / "inc-dequantized"
    deq.save_pretrained(deq_dir)
    copy_config_files(model_dir, deq_dir)
    run_pass("export", ctx, deq_dir, work / "inc-e")
    model = onnx.load(work / "inc-e" / "model.onnx")
    inits = {i.name: i for i in model.graph.initializer}
    nodes, packed = [], 0
    for node in model.graph.node:
        names = _modules_for(node.name) if node.op_type == "MatMul" else []
        if names and all(n in ints for n in names):
            q = np.concatenate([ints[n][0] for n in names])  # (N, K)
            scales = np.concatenate([ints[n][1] for n in names])  # (N, K / group)
            n_out, k = q.shape
            u = (q + 8).astype(np.uint8).reshape(n_out, -1, group)
            blob = (u[..., 0::2] | (u[..., 1::2] << 4)).astype(np.uint8)
            base = node.input[1]
            model.graph.initializer.extend([numpy_helper.from_array(blob, base + "_Q4"),
                                            numpy_helper.from_array(scales.astype(np.float32).reshape(-1), base + "_scales")])
            inits.pop(base, None)
            nodes.append(helper.make_node("MatMulNBits", [node.input[0], base + "_Q4", base + "_scales"], node.output,
                                          name=node.name + "_Q4", domain="com.microsoft", K=k, N=n_out, bits=4,
                                          block_size=group, accuracy_level=level))
            packed += 1
        else:
            nodes.append(node)
    used = {i for n in nodes for i in n.input}
    kept = [i for i in model.graph.initializer if i.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    mixed = work / "inc-mixed"
    mixed.mkdir()
    onnx.save(model, mixed / "model.onnx", save_as_external_data=True, location="model.onnx.data")
    out = work / "inc-q"
    out.mkdir()
    from types import SimpleNamespace

    # What INC left unquantized (e.g. the LM head) gets ORT's RTN at the same bits, group and level.
    options = SimpleNamespace(block_size=group, symmetric=True, accuracy_level=level, algorithm="rtn")
    counts = build_candidate(mixed / "model.onnx", out / "model.onnx", options, [])
    copy_config_files(work / "inc-e", out)
    return out, {"packed_from_inc": packed, **counts}


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
    from helpers import make_ctx, run_pass
    from toy_decoder import build_decoder, corpus
    from transformers import AutoModelForCausalLM, Qwen2Config

    from xformopt.decoder.perplexity import load_token_lists, perplexity
    from xformopt.models import load_tokenizer
    from xformopt.runtime.decoder import OrtDecoder, TorchDecoder

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
    # accuracy_level 4: int8 activations (what ships); 0: float activations, weights-only error like INC in torch.
    for level in (4, 0):
        for algo in ("rtn", "hqq", "gptq"):
            out = root / f"ort-{algo}-{level}"
            started = time.perf_counter()
            run_pass("int4", ctx, root / "e", out, algorithm=algo, block_size=args.group, symmetric=True,
                     calibration_limit=64, accuracy_level=level)
            results[f"ORT {algo}, accuracy_level {level}"] = {"perplexity": perplexity(OrtDecoder(out), lists)["value"],
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
                results[name + " (torch)"] = {"perplexity": perplexity(TorchDecoder(model=model), lists)["value"],
                                              "seconds": round(time.perf_counter() - started, 1)}
                for level in (4,):  # ORT's rows show levels 4 and 0 score alike
                    work = root / f"{name.replace(' ', '-')}-{level}"
                    work.mkdir()
                    packed, counts = pack_inc_into_matmulnbits(model, float_model, model_dir, ctx, work, args.group, level)
                    results[f"{name} packed as MatMulNBits, accuracy_level {level}"] = {
                        "perplexity": perplexity(OrtDecoder(packed), lists)["value"], **counts}
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
