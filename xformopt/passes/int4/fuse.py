"""Same-input projections as one MatMul: gate/up (and q/k/v where the export left them apart) become
one MatMul over the weights concatenated along N, then a Split back into the original outputs.

Done on the float graph, before any packing, so every later step sees one weight: the GGUF carry
(passes/int4/gguf_blocks.py) matches the fused weight's columns to the file's rows as it matches the
builder's packed qkv, and writes ONE MatMulNBits, one block-sum term (one Reshape + ReduceSum per input,
already shared) and one minimum MatMul + Add for the group; RTN, HQQ and GPTQ quantize each column on
its own blocks along K, so the fused weight packs to the members' codes side by side. At batch-1
decode every node is a parallel section the intra-op workers meet at, so fewer, wider nodes are the
point (SmolLM2's exact Q4_1 carry: 4 nodes fewer per layer, see ``fuse_projections`` in the pass).

Members must read the same tensor, have 2-D float initializers with the same K and element type,
and share a role (``decoder/traffic.py``'s, so per-role options such as ``keep_8bit`` and
``block_sizes`` apply to the group as they did to each member); for a GGUF source, the members'
rows must come from one GGUF type (else the fused weight would not be carried). No ONNX or ORT
facility concatenates MatMuls along N (onnxruntime.transformers fuses q/k/v only inside its
attention fusions, onnxruntime-genai's builder only while building), hence this module.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from xformopt.decoder.traffic import role_of

FUSED_NAMES = {"qkv": ("q_proj", "qkv_proj"), "mlp_in": ("gate_proj", "gate_up_proj")}


def same_input_groups(model, exclude: set[str] = frozenset()) -> list[list]:
    """Groups (in graph order) of >= 2 weighted MatMuls reading one tensor with the same K, weight
    type and role; MatMuls in ``exclude`` stay out."""
    inits = {i.name: i for i in model.graph.initializer}
    by_key: dict[tuple, list] = {}
    for node in model.graph.node:
        init = inits.get(node.input[1]) if node.op_type == "MatMul" and len(node.input) == 2 else None
        if init is None or len(init.dims) != 2 or node.name in exclude:
            continue
        role = role_of(node.name)
        if role is None:  # no role, no name that would keep one after fusing
            continue
        by_key.setdefault((node.input[0], init.dims[0], init.data_type, role), []).append(node)
    return [group for group in by_key.values() if len(group) > 1]


def fused_name(group: list) -> str:
    """A name for the fused MatMul that keeps the members' role (traffic.py reads roles from names)."""
    first = group[0].name
    old, new = FUSED_NAMES.get(role_of(first), ("", ""))
    if old and old in first:
        return first.replace(old, new)
    return f"{first}_fused{len(group)}"


def _split(group: list, fused_out: str, widths: list[int], name: str, model) -> object:
    """A Split of ``fused_out`` along its last axis into the members' own outputs."""
    from onnx import helper, numpy_helper

    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    outputs = [node.output[0] for node in group]
    if opset >= 13:  # split sizes became an input in opset 13
        sizes = f"{name}.split_sizes"
        model.graph.initializer.append(numpy_helper.from_array(np.array(widths, dtype=np.int64), sizes))
        return helper.make_node("Split", [fused_out, sizes], outputs, name=f"{name}/Split", axis=-1)
    return helper.make_node("Split", [fused_out], outputs, name=f"{name}/Split", axis=-1, split=widths)


def fuse_projections(model, model_dir: Path, may_fuse=None) -> dict:
    """Fuse every same-input group (``may_fuse(group)`` true, when given) in place: one MatMul over
    the concatenated weights, then a Split. Returns the counts for the pass's record."""
    from onnx import helper, numpy_helper

    from xformopt.passes.int4.gguf_blocks import set_nodes

    nodes_before = len(model.graph.node)
    groups = [g for g in same_input_groups(model) if may_fuse is None or may_fuse(g)]
    inits = {i.name: i for i in model.graph.initializer}
    replace: dict[str, list] = {}  # first member's name -> [fused MatMul, Split]
    dropped, used = set(), set()
    for group in groups:
        weights = [numpy_helper.to_array(inits[n.input[1]], base_dir=str(model_dir)) for n in group]
        name = fused_name(group)
        w_name = f"{name}.weight"
        model.graph.initializer.append(numpy_helper.from_array(np.concatenate(weights, axis=1), w_name))
        out = f"{name}/output_0"
        fused = helper.make_node("MatMul", [group[0].input[0], w_name], [out], name=name)
        replace[group[0].name] = [fused, _split(group, out, [w.shape[1] for w in weights], name, model)]
        dropped.update(n.name for n in group[1:])
        used.update(n.input[1] for n in group)
    kept = []
    for node in model.graph.node:
        if node.name in replace:
            kept.extend(replace[node.name])
        elif node.name not in dropped:
            kept.append(node)
    set_nodes(model, kept, used)
    return {"groups": len(groups), "matmuls_fused": sum(len(g) for g in groups),
            "fused": [{"name": fused_name(g), "members": [n.name for n in g]} for g in groups],
            "float_nodes": {"before": nodes_before, "after": len(model.graph.node)}}


def gguf_same_type(gguf_path: Path, model_dir: Path, inits: dict):
    """``may_fuse`` for a model converted from GGUF: a group fuses when its members' rows all come from
    one GGUF type, or none is in the file (so the fused weight is carried exactly when they would be)."""
    from onnx import numpy_helper

    from xformopt.passes.int4.gguf_blocks import GgufRows

    rows = GgufRows(gguf_path)

    def may_fuse(group: list) -> bool:
        kinds = set()
        for node in group:
            blocks, qtype_or_why = rows.blocks_for(numpy_helper.to_array(inits[node.input[1]], base_dir=str(model_dir)))
            kinds.add(qtype_or_why if blocks is not None else None)
        return len(kinds) == 1

    return may_fuse


# --------------------------------------------------------------------------- parity with the unfused graph


def greedy_parity(reference: Path, fused: Path, prompts: list[list[int]], new_tokens: int = 8,
                  threads: int | None = None) -> dict:
    """Both decoders (stage folders) on ``prompts``: the prompt step and ``new_tokens`` greedy steps,
    the largest |logit difference| over every position, and whether the greedy tokens are identical."""
    from xformopt.runtime.decoder import OrtDecoder

    runners = [OrtDecoder(reference, threads=threads), OrtDecoder(fused, threads=threads)]
    worst, identical = 0.0, True
    for ids in prompts:
        states: list = [None, None]
        step = np.asarray([ids], dtype=np.int64)
        for _ in range(new_tokens + 1):
            outs = [runner.forward(step, state) for runner, state in zip(runners, states)]
            (a, states[0]), (b, states[1]) = outs
            worst = max(worst, float(np.abs(a - b).max()))
            picks = [int(a[0, -1].argmax()), int(b[0, -1].argmax())]
            identical &= picks[0] == picks[1]
            step = np.asarray([[picks[0]]], dtype=np.int64)  # both follow the reference's tokens
    return {"prompts": len(prompts), "new_tokens": new_tokens, "max_abs_logit_diff": worst,
            "greedy_identical": bool(identical)}


PARITY_PROMPTS = ("The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,")


def fused_float(ctx, src: Path, work: Path, gguf: Path | None, exclude: set[str]) -> tuple[Path, dict]:
    """The float graph of ``src`` with its same-input projections fused, written under ``work``
    (external data), and its record: the groups, node counts, and its parity with ``src`` (greedy
    tokens on a few prompts, the largest logit difference: fp32 summation order only)."""
    import onnx

    from xformopt.models import load_tokenizer

    model = onnx.load(src / "model.onnx")
    may_fuse = None
    if gguf is not None:
        may_fuse = gguf_same_type(gguf, src, {i.name: i for i in model.graph.initializer})
    groups_ok = (lambda g: not exclude.intersection(n.name for n in g) and (may_fuse is None or may_fuse(g)))
    record = fuse_projections(model, src, groups_ok)
    if not record["groups"]:  # nothing reads one input twice: pack the graph as it is
        return src / "model.onnx", {**record, "used": False}
    out = work / "fused" / "model.onnx"
    out.parent.mkdir(parents=True)
    onnx.save(model, out, save_as_external_data=True, all_tensors_to_one_file=True, location="model.onnx.data",
              size_threshold=1024)
    tokenizer = load_tokenizer(src, ctx.spec.trust_remote_code)
    prompts = [list(tokenizer(text)["input_ids"]) for text in PARITY_PROMPTS]
    record["parity"] = greedy_parity(src, out.parent, prompts, threads=ctx.threads)
    ctx.log(f"fused {record['matmuls_fused']} same-input MatMuls into {record['groups']} "
            f"({record['float_nodes']['before']} -> {record['float_nodes']['after']} float-graph nodes); "
            f"parity with the unfused graph: max |logit diff| {record['parity']['max_abs_logit_diff']:.2e}, "
            f"greedy tokens {'identical' if record['parity']['greedy_identical'] else 'DIFFERENT'}")
    if not record["parity"]["greedy_identical"]:  # never seen (summation order only), but be safe
        ctx.log("WARNING: fused projections changed a greedy token; packing the unfused graph instead")
        return src / "model.onnx", {**record, "used": False}
    return out, {**record, "used": True}
