"""Carry a GGUF file's quantized blocks into ``MatMulNBits`` as they are, instead of dequantizing
and quantizing again on another grid (which, on SmolLM2's Q4_1 file, cost 30% perplexity).

The GGUF types that map onto MatMulNBits (blocks of 32 along K, one fp16 scale each):

- ``Q4_0``: ``d * (q - 8)``, q in 0..15 -> 4-bit, scale d, no zero points (the op's default is 8);
- ``Q8_0``: ``d * q``, q int8 -> 8-bit, stored ``q + 128``, no zero points (the default is 128);
- ``Q4_1``: ``d * q + m`` -> 4-bit, scale d, plus the per-block minimum as a separate term
  ``Σ_b m'[n, b] · Σ_{k in b} x_k`` (a ReduceSum over each 32-block of the input, shared by every
  MatMul on that input, and a small ``[K/32, N]`` MatMul, added to the op's output). The 4-bit part
  keeps the op's default zero point 8 (``d * (q - 8)``, the kernels' symmetric path, no zero-point
  tensor) and the minimum absorbs the difference, ``m' = m + 8d``, which is exact in float32 for
  fp16 ``d`` and ``m`` unless their exponents lie far apart; it is checked per tensor, and a tensor
  where it is not exact gets explicit zero points 0 and ``m`` itself. MatMulNBits can also take
  float zero points, which would say ``d * (q - zp)`` in one op, but ORT 1.32's CPU kernel runs them
  by dequantizing the whole weight on every call (25x slower than uint8 zero points, measured on a
  576x1536 weight), and ``-m/d`` as a zero point is not exact in float arithmetic.
  ``exact=False`` (the int4 pass's ``exact_gguf: false``) drops the separate term instead: codes and
  scales stay the file's, and the minimum becomes the nearest 4-bit zero point, ``d * (q - zp)`` with
  ``zp = round(-m / d)`` in 0..15: one op per MatMul and no block sums, at the cost of shifting each
  block's weights by at most ``d / 2`` (recorded per tensor).

Rows are found by content, not by name: every row of every carried GGUF tensor is dequantized (with
the gguf package's own ``dequantize``) and hashed; a weighted MatMul's ``[K, N]`` initializer is
carried when each of its N columns equals a GGUF row bit for bit and all of them come from one
type. That follows whatever the checkpoint did to the rows on the way (transformers' reverse
permutation of Llama's Q/K heads, the builder's packing of q/k/v and gate/up into one MatMul, the
tied lm_head) without re-implementing any of it, and a MatMul whose weights were changed after the
conversion (pruned, smoothed) is simply not matched and goes through the ordinary quantizer.

``gguf_source`` finds the file a checkpoint was converted from (and checks it is unchanged) and
``carry_record`` says in the pass's record what was carried.

The unpacking of a block into its integer codes is hand-written: the gguf package dequantizes
blocks but exposes no call that returns the codes.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from xformopt.sources.gguf import read_source, sha256_of

BLOCK = 32
# type -> (bytes per block, bits in MatMulNBits)
LAYOUTS = {"Q4_0": (18, 4), "Q4_1": (20, 4), "Q8_0": (34, 8)}


@dataclass
class Blocks:
    """Integer codes and scales of some rows: ``q`` [rows, K/32, 32] uint8 as MatMulNBits stores
    them (4-bit 0..15, 8-bit 0..255), ``d`` [rows, K/32] float32, ``m`` (Q4_1 only) the minimums."""

    qtype: str
    q: np.ndarray
    d: np.ndarray
    m: np.ndarray | None = None


def unpack(raw: np.ndarray, qtype: str) -> Blocks:
    """GGUF block bytes [rows, K/32 * block_bytes] -> codes and scales (ggml's block_q4_0/q4_1/q8_0:
    fp16 d (and fp16 m), then 16 bytes whose low nibbles are elements 0..15 and high nibbles 16..31,
    or 32 int8)."""
    size, _ = LAYOUTS[qtype]
    blocks = np.ascontiguousarray(raw).reshape(raw.shape[0], -1, size)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    if qtype == "Q8_0":
        q = (blocks[..., 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
        return Blocks(qtype, q, d)
    start = 4 if qtype == "Q4_1" else 2
    qs = blocks[..., start:start + 16]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)
    m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32) if qtype == "Q4_1" else None
    return Blocks(qtype, q, d, m)


def dequantize(blocks: Blocks) -> np.ndarray:
    """What MatMulNBits (plus the Q4_1 minimum term) computes the weights as, [rows, K] float32."""
    if blocks.qtype == "Q8_0":
        w = blocks.d[..., None] * (blocks.q.astype(np.float32) - 128)
    elif blocks.qtype == "Q4_0":
        w = blocks.d[..., None] * (blocks.q.astype(np.float32) - 8)
    else:
        w = blocks.d[..., None] * blocks.q.astype(np.float32) + blocks.m[..., None]
    return w.reshape(w.shape[0], -1)


def pack_b(q: np.ndarray, bits: int) -> np.ndarray:
    """MatMulNBits' B: [N, K/32, 32 * bits / 8] uint8, 4-bit element 2j in byte j's low nibble."""
    if bits == 8:
        return np.ascontiguousarray(q)
    return np.ascontiguousarray(q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)


def _key(row: np.ndarray) -> bytes:
    # + 0.0 turns -0.0 (d * 0 for a negative d) into 0.0: a copy that lost the sign is the same weight
    return hashlib.blake2b((np.asarray(row, dtype=np.float32) + np.float32(0)).tobytes(), digest_size=16).digest()


class GgufRows:
    """Every row of the carried-type tensors of one GGUF file, indexed by its dequantized content."""

    def __init__(self, gguf_path: Path):
        from gguf import GGUFReader
        from gguf.quants import dequantize as gguf_dequantize

        self.reader = GGUFReader(str(gguf_path))
        self.index: dict[bytes, tuple[int, int]] = {}
        self.types: dict[str, int] = {}
        for t_index, tensor in enumerate(self.reader.tensors):
            name = tensor.tensor_type.name
            if name not in LAYOUTS or len(tensor.data.shape) != 2:
                continue
            values = gguf_dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False)
            self.types[name] = self.types.get(name, 0) + 1
            for row in range(values.shape[0]):
                self.index.setdefault(_key(values[row]), (t_index, row))

    def blocks_for(self, weight: np.ndarray) -> tuple[Blocks | None, str]:
        """The GGUF blocks whose dequantization is ``weight`` ([K, N], MatMul's B) column for column,
        or (None, why not)."""
        k, n = weight.shape
        if k % BLOCK:
            return None, f"K={k} is not a multiple of {BLOCK}"
        columns = np.ascontiguousarray(weight.T, dtype=np.float32)
        hits = []
        for col in range(n):
            hit = self.index.get(_key(columns[col]))
            if hit is None:
                return None, f"column {col} matches no GGUF row (weights changed after conversion, or another type)"
            hits.append(hit)
        qtypes = {self.reader.tensors[t].tensor_type.name for t, _ in hits}
        if len(qtypes) != 1:
            return None, f"its rows come from several GGUF types ({', '.join(sorted(qtypes))})"
        qtype = qtypes.pop()
        raw = np.empty((n, (k // BLOCK) * LAYOUTS[qtype][0]), dtype=np.uint8)
        for t_index in {t for t, _ in hits}:  # gather per tensor: one fancy index per source tensor
            rows = [i for i, (t, _) in enumerate(hits) if t == t_index]
            raw[rows] = self.reader.tensors[t_index].data[[hits[i][1] for i in rows]]
        blocks = unpack(raw, qtype)
        if not np.array_equal(dequantize(blocks), columns):  # the codes say exactly what the rows said
            return None, "its unpacked blocks do not dequantize to the weights"
        return blocks, qtype


AUX = "/gguf_min_"  # in the names of the Q4_1 minimum term's nodes (no MatMul the quantizers may take)


def carry_into(model, model_dir: Path, gguf_path: Path, accuracy_level: int, only: set[str] | None = None,
               exact: bool = True, sums_by: str = "reduce") -> tuple[list[dict], dict[str, str]]:
    """Replace each weighted MatMul (of ``only``, when given) whose weights are a GGUF tensor's rows
    with MatMulNBits holding those blocks, in place (Q4_1's minimums exactly, or as rounded zero points
    when ``exact`` is false). Returns (a record per carried MatMul, {name: why not} for the others)."""
    from onnx import helper, numpy_helper

    rows = GgufRows(gguf_path)
    inits = {i.name: i for i in model.graph.initializer}
    carried, skipped = [], {}
    new_nodes, block_sums, replaced = [], {}, set()
    for node in list(model.graph.node):
        init = inits.get(node.input[1]) if node.op_type == "MatMul" and len(node.input) > 1 else None
        if init is None or len(init.dims) != 2 or (only is not None and node.name not in only):
            new_nodes.append(node)
            continue
        weight = numpy_helper.to_array(init, base_dir=str(model_dir))
        blocks, qtype_or_why = rows.blocks_for(weight)
        if blocks is None:
            skipped[node.name] = qtype_or_why
            new_nodes.append(node)
            continue
        k, n = weight.shape
        bits = LAYOUTS[blocks.qtype][1]
        base = node.name or f"gguf_carried_{len(carried)}"
        b_name, s_name = f"{base}.gguf_B", f"{base}.gguf_scales"
        model.graph.initializer.extend([numpy_helper.from_array(pack_b(blocks.q, bits), b_name),
                                        numpy_helper.from_array(blocks.d.reshape(-1), s_name)])
        inputs, out = [node.input[0], b_name, s_name], node.output[0]
        record = {"name": node.name, "type": blocks.qtype, "bits": bits, "K": k, "N": n}
        if blocks.qtype == "Q4_1" and not exact:
            zero_points, shift = rounded_zero_points(blocks)
            zp_name = f"{base}.gguf_zero_points"
            model.graph.initializer.append(numpy_helper.from_array(pack_zero_points(zero_points), zp_name))
            inputs.append(zp_name)
            record.update(zero_point="rounded minimum", max_shift_in_steps=round(shift, 4))
        elif blocks.qtype == "Q4_1":
            out = f"{base}.gguf_scaled"
            minimums = symmetric_minimums(blocks)
            if minimums is None:  # m + 8d not exact somewhere: zero points 0 and m as it is
                zp_name, minimums = f"{base}.gguf_zero_points", blocks.m
                model.graph.initializer.append(numpy_helper.from_array(
                    np.zeros(n * ((k // BLOCK + 1) // 2), dtype=np.uint8), zp_name))
                inputs.append(zp_name)
            record["zero_point"] = "explicit 0" if len(inputs) > 3 else "default 8 (minimum + 8d)"
        new_nodes.append(helper.make_node("MatMulNBits", inputs, [out], name=f"{base}_Q{bits}", domain="com.microsoft",
                                          K=k, N=n, bits=bits, block_size=BLOCK, accuracy_level=accuracy_level))
        if blocks.qtype == "Q4_1" and exact:
            new_nodes.extend(_minimum_term(node, base, minimums, k, block_sums, model, sums_by == "matmul"))
        replaced.add(init.name)
        carried.append(record)
    set_nodes(model, new_nodes, replaced)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return carried, skipped


def symmetric_minimums(blocks: Blocks) -> np.ndarray | None:
    """``m + 8d`` per block, the minimum that goes with the default zero point 8 (``d * (q - 8) + m +
    8d = d * q + m``), when float32 holds every sum exactly; else None."""
    shifted = blocks.m + np.float32(8) * blocks.d
    exact = shifted.astype(np.float64) == blocks.m.astype(np.float64) + 8 * blocks.d.astype(np.float64)
    return shifted if bool(exact.all()) else None


def rounded_zero_points(blocks: Blocks) -> tuple[np.ndarray, float]:
    """Q4_1's ``d * q + m`` as ``d * (q - zp)``: ``zp = round(-m / d)`` clipped to 0..15 ([rows, K/32]
    uint8), and the largest shift this puts on a block's weights, in units of its step ``d`` (0.5
    unless a clip or a zero step made it larger)."""
    d, m = blocks.d.astype(np.float64), blocks.m.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        ideal = np.where(d != 0, -m / np.where(d != 0, d, 1), 8.0)
    zero_points = np.clip(np.rint(ideal), 0, 15)
    shift = np.abs(m + d * zero_points)  # what d * (q - zp) misses of d * q + m, per block
    steps = np.where(d != 0, shift / np.where(d != 0, np.abs(d), 1), np.where(shift > 0, np.inf, 0))
    return zero_points.astype(np.uint8), float(steps.max(initial=0.0))


def pack_zero_points(zero_points: np.ndarray) -> np.ndarray:
    """MatMulNBits' 4-bit zero points: [N, ceil(K/32 / 2)] uint8, block 2j in byte j's low nibble."""
    rows, count = zero_points.shape
    padded = np.zeros((rows, count + count % 2), dtype=np.uint8)
    padded[:, :count] = zero_points
    return np.ascontiguousarray(padded[:, 0::2] | (padded[:, 1::2] << 4)).reshape(-1)


def _rank(model, name: str) -> int | None:
    """The rank ``name`` is declared with (graph input, output or value_info), if any."""
    for value in (*model.graph.input, *model.graph.value_info, *model.graph.output):
        if value.name == name and value.type.tensor_type.HasField("shape"):
            return len(value.type.tensor_type.shape.dim)
    return None


def _block_sums(x: str, base: str, k: int, model, by_matmul: bool = False) -> tuple[list, str]:
    """Nodes summing each 32-block of ``x`` along its last axis, and their output. A Reshape to
    ``[..., K/32, 32]`` and a ReduceSum when the rank of ``x`` is declared and ``by_matmul`` is false;
    else (any rank) one MatMul with the [K, K/32] 0/1 block indicator (exact products; one initializer
    per K for the whole graph, so it stays in cache), one node instead of two."""
    from onnx import helper, numpy_helper

    sums = f"{base}.gguf_block_sums"
    rank = _rank(model, x)
    if rank is None or by_matmul:
        name = f"gguf_block_indicator_{k}"
        if not any(i.name == name for i in model.graph.initializer):
            indicator = np.repeat(np.eye(k // BLOCK, dtype=np.float32), BLOCK, axis=0)
            model.graph.initializer.append(numpy_helper.from_array(indicator, name))
        return [helper.make_node("MatMul", [x, name], [sums], name=f"{base}{AUX}block_sum")], sums
    shape, blocks = f"{base}.gguf_block_shape", f"{base}.gguf_blocks"
    model.graph.initializer.append(numpy_helper.from_array(np.array([0] * (rank - 1) + [k // BLOCK, BLOCK], dtype=np.int64), shape))
    nodes = [helper.make_node("Reshape", [x, shape], [blocks], name=f"{base}{AUX}block_reshape")]
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    if opset >= 13:  # axes became an input in opset 13
        axes = f"{base}.gguf_block_axes"
        model.graph.initializer.append(numpy_helper.from_array(np.array([-1], dtype=np.int64), axes))
        nodes.append(helper.make_node("ReduceSum", [blocks, axes], [sums], name=f"{base}{AUX}block_sum", keepdims=0))
    else:
        nodes.append(helper.make_node("ReduceSum", [blocks], [sums], name=f"{base}{AUX}block_sum", axes=[-1], keepdims=0))
    return nodes, sums


def _minimum_term(node, base: str, minimums: np.ndarray, k: int, block_sums: dict, model, by_matmul: bool) -> list:
    """Q4_1's minimum term: the block sums of the MatMul's input (shared by every MatMul on that
    input) times ``minimums`` [N, K/32] as a [K/32, N] float MatMul, added to the MatMulNBits output."""
    from onnx import helper, numpy_helper

    nodes = []
    x = node.input[0]
    if x not in block_sums:
        made, block_sums[x] = _block_sums(x, base, k, model, by_matmul)
        nodes.extend(made)
    m_name = f"{base}.gguf_minimums"
    model.graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(minimums.T), m_name))
    nodes += [helper.make_node("MatMul", [block_sums[x], m_name], [f"{base}.gguf_min_term"], name=f"{base}{AUX}matmul"),
              helper.make_node("Add", [f"{base}.gguf_scaled", f"{base}.gguf_min_term"], [node.output[0]],
                               name=f"{base}{AUX}add")]
    return nodes


def aux_nodes(model) -> list[str]:
    """The Q4_1 minimum term's MatMuls: float by design, never quantized or counted as kept float."""
    return [n.name for n in model.graph.node if AUX in n.name]


# --------------------------------------------------------------------------- the int4 pass's GGUF source


def gguf_source(ctx, src: Path, carry: bool) -> tuple[Path | None, dict | None]:
    """The GGUF file ``src`` was converted from (xformopt/sources/gguf.py), when its blocks are to be
    carried and the file is still there with the same content; else None (logged: RTN then)."""
    source = read_source(src)
    if source is None or not carry:
        return None, None
    path = Path(source["file"])
    if not path.is_file() or path.stat().st_size != source["size"] or sha256_of(path) != source["sha256"]:
        ctx.log(f"WARNING: {source['name']} (the GGUF this model came from) is gone or changed at {path}; "
                "quantizing its dequantized weights again instead of carrying its blocks")
        return None, {**source, "carried": False}
    return path, source


def carry_record(ctx, source: dict, counts: dict, candidates: list[str], exact: bool) -> dict:
    carried, missed = counts["gguf_carried"], counts["gguf_not_carried"]
    by_type: dict[str, int] = {}
    for row in carried:
        by_type[row["type"]] = by_type.get(row["type"], 0) + 1
    ctx.log(f"carried {len(carried)}/{len(candidates)} MatMuls' blocks from {source['name']} "
            f"{'exactly' if exact else 'with Q4_1 minimums rounded to zero points'} "
            f"({', '.join(f'{n} {t}' for t, n in by_type.items()) or 'none'}); "
            f"{len(missed)} left to the int4 algorithm")
    return {"file": source["file"], "sha256": source["sha256"], "file_type": source.get("file_type"),
            "carried": len(carried), "carried_by_type": by_type, "not_carried": missed,
            "exact": exact,
            "how": ("GGUF blocks copied into MatMulNBits (Q4_1 minimums as a block-sum term), checked to dequantize "
                    "to the checkpoint's weights bit for bit") if exact else
                   ("GGUF codes and scales copied into MatMulNBits, Q4_1 minimums rounded to 4-bit zero points "
                    "(each block's weights shift by at most half a step; max_shift_in_steps per tensor)")}


def set_nodes(model, nodes: list, freed: set[str]) -> None:
    """Make ``nodes`` the graph's nodes, and drop the initializers named in ``freed`` that no node reads
    any more (the weights a rewrite replaced)."""
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    still_read = {name for node in model.graph.node for name in node.input}
    for init in [i for i in model.graph.initializer if i.name in freed and i.name not in still_read]:
        model.graph.initializer.remove(init)
