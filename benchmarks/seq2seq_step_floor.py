"""How low a decoder step can go inside ONNX Runtime's BeamSearch op (issue 55): the op's own per-step floor and
per-node cost, and a step whose attentions are ONNX primitives instead of ORT's attention kernels, each timed
against the artifact's real step and CTranslate2's by ``seq2seq_step_costs.py`` (one interleaved run).

Variants of the INT8 ``generate.onnx``, its encoder subgraph untouched:
- ``op-floor``: the decoder subgraph is one ``Gather`` (the logits) and one ``Pad`` per self-attention cache
  (so the cache grows by a position a step, as in the real graph): what the op costs around any decoder;
- ``op-floor+40``: the same with 40 ``Relu`` nodes on the logits, giving the executor's cost per extra node;
- ``primitive-cross`` / ``primitive-self`` / ``primitive-both``: the step's cross-attention (``MultiHeadAttention``)
  and/or self-attention (ONNX ``Attention``) written as Reshape, MatMul, Softmax, MatMul, Reshape (self-attention
  adds the cache Concats and the position bias). The tokens are checked equal to the artifact's on the sources.

Run: OMP_WAIT_POLICY=PASSIVE python benchmarks/seq2seq_step_floor.py --src HF --ct2 CT2_DIR \
    --int8 INT8/generate.onnx --float FLOAT/generate.onnx --out benchmarks/results/seq2seq-step-floor
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

import xformopt  # noqa: F401  (ORT telemetry off before onnxruntime loads)


def decoder_graph(model):
    return next(a for a in model.graph.node[0].attribute if a.name == "decoder").g


def op_floor(model, chain: int) -> None:
    """Replace the decoder subgraph by Gather -> ``chain`` Relus -> logits, and a Pad per self-attention cache."""
    from onnx import helper, numpy_helper

    graph = decoder_graph(model)
    vocab = graph.output[0].type.tensor_type.shape.dim[2].dim_value
    table = np.zeros((vocab, vocab), np.float32)
    table[np.arange(vocab), 2 + np.arange(vocab) % (vocab - 2)] = 1.0  # never EOS (id 1) nor pad (0)
    nodes = [helper.make_node("Gather", ["floor/table", "input_ids"], ["floor/l0"])]
    nodes += [helper.make_node("Relu", [f"floor/l{k}"], [f"floor/l{k + 1}"]) for k in range(chain)]
    nodes.append(helper.make_node("Identity", [f"floor/l{chain}"], ["logits"]))
    for out in graph.output[1:]:  # present_{key,value}_self_i = past padded by one position on the sequence axis
        nodes.append(helper.make_node("Pad", [out.name.replace("present", "past"), "floor/pads"], [out.name]))
    pads = np.array([0, 0, 0, 0, 0, 0, 1, 0], np.int64)
    floor = helper.make_graph(nodes, graph.name, list(graph.input), list(graph.output),
                              [numpy_helper.from_array(table, "floor/table"), numpy_helper.from_array(pads, "floor/pads")])
    graph.CopyFrom(floor)


def primitive_attention(model, which: set[str]) -> int:
    """Write the step's attentions as primitives; returns how many were replaced."""
    from onnx import helper, numpy_helper

    graph = decoder_graph(model)
    nodes, replaced, width = [], 0, graph_width(model)
    for i, node in enumerate(graph.node):
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        p = f"primitive{i}/"
        if node.op_type == "MultiHeadAttention" and "cross" in which:
            heads = attrs["num_heads"]
            q, k, v = node.input[:3]
            new = [helper.make_node("Reshape", [q, p + "heads"], [p + "q"]),
                   helper.make_node("FusedMatMul", [p + "q", k], [p + "s"], domain="com.microsoft", transB=1,
                                    alpha=float(attrs.get("scale", 1.0))),
                   helper.make_node("Softmax", [p + "s"], [p + "p"], axis=-1),
                   helper.make_node("MatMul", [p + "p", v], [p + "o"]),
                   helper.make_node("Reshape", [p + "o", p + "flat"], [node.output[0]])]
        elif node.op_type == "Attention" and node.domain == "" and "self" in which:
            heads = attrs["q_num_heads"]
            q, k, v, bias, past_k, past_v = node.input
            out, present_k, present_v = node.output
            new = [helper.make_node("Reshape", [q, p + "heads"], [p + "q"]),
                   helper.make_node("Reshape", [k, p + "heads"], [p + "k"]),
                   helper.make_node("Reshape", [v, p + "heads"], [p + "v"]),
                   helper.make_node("Concat", [past_k, p + "k"], [present_k], axis=2),
                   helper.make_node("Concat", [past_v, p + "v"], [present_v], axis=2),
                   helper.make_node("FusedMatMul", [p + "q", present_k], [p + "s0"], domain="com.microsoft",
                                    transB=1, alpha=float(attrs.get("scale", 1.0))),
                   helper.make_node("Add", [p + "s0", bias], [p + "s"]),
                   helper.make_node("Softmax", [p + "s"], [p + "p"], axis=-1),
                   helper.make_node("MatMul", [p + "p", present_v], [p + "o"]),
                   helper.make_node("Reshape", [p + "o", p + "flat"], [out])]
        else:
            nodes.append(node)
            continue
        # one query position a step: [batch, 1, heads * size] <-> [batch, heads, 1, size] is a plain reshape
        graph.initializer.extend([numpy_helper.from_array(np.array([0, heads, 1, width // heads], np.int64), p + "heads"),
                                  numpy_helper.from_array(np.array([0, 1, width], np.int64), p + "flat")])
        nodes += new
        replaced += 1
    del graph.node[:]
    graph.node.extend(nodes)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return replaced


def graph_width(model) -> int:
    """heads x head size, from the self-attention cache's declared shape."""
    dims = decoder_graph(model).input[2].type.tensor_type.shape.dim
    return dims[1].dim_value * dims[3].dim_value


def same_tokens(reference: Path, variant: Path, beams: int) -> tuple[int, int]:
    """Sources (of the held-out reverse split) on which the two graphs give the same tokens, and how many."""
    from transformers import AutoTokenizer

    from xformopt.resources import word_seq2seq_path
    from xformopt.seq2seq.generate import GenerationSettings
    from xformopt.seq2seq.search_graph import OrtSearchGraph

    artifact = reference.parent
    tokenizer = AutoTokenizer.from_pretrained(artifact)
    texts = [json.loads(line)["source"] for line in word_seq2seq_path("reverse", "test").read_text().splitlines()]
    settings = GenerationSettings.from_model_dir(artifact).with_(num_beams=beams, max_new_tokens=47,
                                                                 length_penalty=1.0, early_stopping=False)
    graphs = [OrtSearchGraph(p, threads=1) for p in (reference, variant)]
    equal = 0
    for text in texts:
        enc = tokenizer([text], return_tensors="np")
        a, b = (g.generate(enc["input_ids"], enc["attention_mask"], settings) for g in graphs)
        equal += int(a == b)
    return equal, len(texts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", type=Path, required=True, help="the Hugging Face folder (tokenizer)")
    parser.add_argument("--ct2", type=Path, required=True, help="CTranslate2's INT8 folder")
    parser.add_argument("--int8", type=Path, required=True, help="the INT8 artifact's generate.onnx")
    parser.add_argument("--float", type=Path, required=True, help="the float artifact's generate.onnx")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--beams", default="1,4")
    parser.add_argument("--work", type=Path, help="where the variant graphs go (default: a temporary folder)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    import onnx

    graphs = args.work or Path(tempfile.mkdtemp(prefix="step-floor-"))
    graphs.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    variants: dict[str, Path] = {"int8": args.int8, "float": args.float}
    checks: dict[str, dict] = {}
    for name, chain in (("op-floor", 0), ("op-floor+40", 40)):
        model = onnx.load(args.int8)
        op_floor(model, chain)
        onnx.save(model, graphs / f"{name}.onnx")
        variants[name] = graphs / f"{name}.onnx"
    for name, which in (("primitive-cross", {"cross"}), ("primitive-self", {"self"}),
                        ("primitive-both", {"cross", "self"})):
        model = onnx.load(args.int8)
        replaced = primitive_attention(model, which)
        onnx.save(model, graphs / f"{name}.onnx")
        variants[name] = graphs / f"{name}.onnx"
        checks[name] = {"attentions_replaced": replaced}
        for beams in map(int, args.beams.split(",")):
            equal, total = same_tokens(args.int8, variants[name], beams)
            checks[name][f"same_tokens_{beams}_beams"] = f"{equal}/{total}"
        print(name, checks[name], file=sys.stderr)
    (args.out / "variants.json").write_text(json.dumps(
        {"variants": sorted(variants), "checks": checks}, indent=1) + "\n")
    for beams in args.beams.split(","):
        command = [sys.executable, str(Path(__file__).with_name("seq2seq_step_costs.py")), "--src", str(args.src),
                   "--ct2", str(args.ct2), "--beams", beams, "--rounds", str(args.rounds), "--out", str(args.out)]
        for name, path in variants.items():
            command += ["--graph", f"{name}={path}"]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)


if __name__ == "__main__":
    main()
