"""DeBERTa-v2/v3 attention -> ``com.microsoft.MultiHeadAttention``, in ONNX Runtime's ``Fusion`` style.

ORT's optimizer has no DeBERTa fuser (optimum routes the family to the BERT one, which matches only the
layer norms). DeBERTa's disentangled attention adds content->position and position->content terms to
the scores; both are gathers over relative-position buckets computed from Q, K and the (shared)
relative embeddings, which no ORT kernel computes. So this fusion keeps that subgraph as it is and
fuses only the core around it (per layer, as torch's dynamo exporter and the TorchScript tracer both write it;
the head Reshapes' shapes are constants [0, 0, H, -1] in the tracer's graph and Concats of
[Shape(batch), Shape(length), H, -1] in the dynamo graph, where sqrt(d * scale_factor) is folded to a constant)::

    scores = MatMul(Q_heads, Div(K_heads^T, sqrt(d * scale_factor))) + rel      [B*H, S, S]
    probs  = Softmax(Where(Not(mask), finfo.min, Reshape(scores, [B, H, S, S])))
    ctx    = Reshape(Transpose(Reshape(MatMul(Reshape(probs), V_heads))))     [B, S, H*d]

becomes ``MultiHeadAttention(q, k, v, attention_bias=Where(Not(mask), finfo.min, Reshape(rel)))`` with
``scale = 1 / sqrt(d * scale_factor)``: the relative terms, padding mask folded in, are the attention
bias, so the graph computes exactly the same sum before the softmax. Written by hand because no
library fuses this (onnxscript's rewriter has no DeBERTa rule either); in ORT's ``Fusion`` style rather than
as an onnxscript pattern because it runs as the family's ``own_fusion``, on ORT's OnnxModel after ORT's
optimizer, for the dynamo and the TorchScript graph alike.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
from onnx import TensorProto, helper
from onnxruntime.transformers.fusion_base import Fusion
from onnxruntime.transformers.onnx_model import OnnxModel


class _Scores(NamedTuple):
    """One layer's score nodes: the mask's Where, Q.K^T, the Add of the relative terms (None without
    relative attention) and those terms, then Q's and K's head Reshapes, K's scaling Div and Transpose."""

    where: Any
    qk: Any
    add: Any
    rel: str | None
    q_reshape: Any
    div: Any
    k_transpose: Any
    k_reshape: Any


class FusionDebertaV2Attention(Fusion):
    def __init__(self, model: OnnxModel):
        super().__init__(model, "MultiHeadAttention", "Softmax", "DeBERTa-v2 disentangled attention")
        self.prune_graph = True  # the shape subgraphs of the removed Reshapes become dead
        self.zero: str | None = None  # the scalar 0 bias shared by layers without relative attention

    def _const(self, name: str):
        value = self.model.get_constant_value(name)
        return None if value is None else np.asarray(value)

    def _shape_items(self, name: str, output_name_to_node) -> list[int | None] | None:
        """A Reshape's target shape, item by item (None where computed at run time): a constant (the
        TorchScript export: [0, 0, H, -1]) or a Concat of one-item pieces (the dynamo export:
        [Shape(batch), Shape(length), H, -1])."""
        value = self._const(name)
        if value is not None:
            return [int(v) for v in value.reshape(-1)]
        node = output_name_to_node.get(name)
        if node is None or node.op_type != "Concat":
            return None
        items: list[int | None] = []
        for piece in node.input:
            value = self._const(piece)
            if value is not None and value.size != 1:
                return None
            items.append(None if value is None else int(value.reshape(())))
        return items

    def _heads(self, reshape, output_name_to_node) -> tuple[int, int] | None:
        """(heads, head size) of a [B, S, H, d] Reshape: H from its shape ([0, 0, H, -1] or [B, S, H, d]),
        d from the shape or from the width of the projection it reshapes."""
        shape = self._shape_items(reshape.input[1], output_name_to_node)
        if shape is None or len(shape) != 4 or not shape[2] or shape[2] <= 0:
            return None
        heads, size = shape[2], shape[3]
        if size is None or size <= 0:
            width = self._projection_width(reshape.input[0], output_name_to_node)
            if width is None or width % heads:
                return None
            size = width // heads
        return heads, size

    def _projection_width(self, name: str, output_name_to_node) -> int | None:
        """Output width of Add(bias, MatMul(x, W)) (or the MatMul alone), from W's initializer."""
        node = output_name_to_node.get(name)
        if node is not None and node.op_type == "Add":
            node = next((output_name_to_node[i] for i in node.input if i in output_name_to_node
                         and output_name_to_node[i].op_type == "MatMul"), None)
        if node is None or node.op_type != "MatMul":
            return None
        weight = self.model.get_initializer(node.input[1])
        return None if weight is None or len(weight.dims) != 2 else int(weight.dims[1])

    def _scale_factor(self, divisor: str, output_name_to_node) -> float | None:
        """DeBERTa divides K^T by sqrt(d * scale_factor) (1 + one per c2p/p2c term), computed from the
        shape at run time: Sqrt(Mul(Cast(d), scale_factor)). The constant factor is read from the Mul."""
        value = self._const(divisor)
        if value is not None:
            return None  # a folded divisor: the caller uses it directly
        node = output_name_to_node.get(divisor)
        while node is not None and node.op_type == "Cast":
            node = output_name_to_node.get(node.input[0])
        if node is None or node.op_type != "Sqrt":
            return None
        mul = output_name_to_node.get(node.input[0])
        if mul is None or mul.op_type != "Mul":
            return None
        for i in (0, 1):
            factor = self._const(mul.input[i])
            if factor is not None and factor.size == 1:
                return float(factor.reshape(()))
        return None

    def _scores(self, softmax, output_name_to_node) -> _Scores | None:
        """Before the softmax: the padding mask's Where over Q.K^T (+ the relative terms) reshaped to [B, H, S, S]."""
        model = self.model
        where = model.match_parent(softmax, "Where", 0, output_name_to_node)
        fill = None if where is None else self._const(where.input[1])
        if fill is None or fill.size != 1 or float(fill.reshape(())) > -1e4:  # not a padding mask's fill
            return None
        to_4d = model.match_parent(where, "Reshape", 2, output_name_to_node)
        scores = None if to_4d is None else output_name_to_node.get(to_4d.input[0])
        qk, add, rel = None, None, None
        if scores is not None and scores.op_type == "MatMul":  # relative_attention false: no bias terms
            qk = scores
        elif scores is not None and scores.op_type == "Add":
            add = scores
            for i in (0, 1):
                parent = output_name_to_node.get(add.input[i])
                if parent is not None and parent.op_type == "MatMul":
                    qk, rel = parent, add.input[1 - i]
                    break
        if qk is None:
            return None
        q_path = model.match_parent_path(qk, ["Reshape", "Transpose", "Reshape"], [0, 0, 0], output_name_to_node)
        k_path = model.match_parent_path(
            qk, ["Div", "Transpose", "Reshape", "Transpose", "Reshape"], [1, 0, 0, 0, 0], output_name_to_node)
        if q_path is None or k_path is None:
            return None
        return _Scores(where, qk, add, rel, q_path[2], k_path[0], k_path[1], k_path[4])

    def _context(self, softmax, input_name_to_nodes, output_name_to_node) -> tuple[list, object] | None:
        """After the softmax: ([Reshape(probs), MatMul(probs, V), Reshape, Transpose, Reshape], V's head Reshape)."""
        nodes, node = [], softmax
        for op in ("Reshape", "MatMul", "Reshape", "Transpose", "Reshape"):
            nexts = [c for c in input_name_to_nodes.get(node.output[0], []) if c.op_type != "Shape"]
            if len(nexts) != 1 or nexts[0].op_type != op or (op == "MatMul" and nexts[0].input[0] != node.output[0]):
                return None
            node = nexts[0]
            nodes.append(node)
        v_path = self.model.match_parent_path(nodes[1], ["Reshape", "Transpose", "Reshape"], [1, 0, 0],
                                              output_name_to_node)
        if v_path is None or list(self.model.get_node_attribute(nodes[3], "perm") or []) != [0, 2, 1, 3]:
            return None
        return nodes, v_path[2]

    def _divisor(self, div, head_size: int, output_name_to_node) -> float | None:
        folded = self._const(div.input[1])
        if folded is not None:
            return float(folded.reshape(())) if folded.size == 1 else None
        factor = self._scale_factor(div.input[1], output_name_to_node)
        return None if factor is None else math.sqrt(head_size * factor)

    def fuse(self, softmax, input_name_to_nodes, output_name_to_node):
        scores = self._scores(softmax, output_name_to_node)
        context = None if scores is None else self._context(softmax, input_name_to_nodes, output_name_to_node)
        if context is None:
            return
        tail, v_reshape = context
        heads = self._heads(scores.q_reshape, output_name_to_node)
        if heads is None or any(heads != self._heads(r, output_name_to_node) for r in (scores.k_reshape, v_reshape)):
            return
        divisor = self._divisor(scores.div, heads[1], output_name_to_node)
        # K^T and Q.K^T are needed only by the scores: anything else reading them (there is nothing in
        # DeBERTa's graph) would lose its input.
        inner = [n for n in (scores.div, scores.k_transpose, scores.qk, scores.add) if n is not None]
        if divisor is None or any(
                len([c for c in input_name_to_nodes.get(n.output[0], []) if c.op_type != "Shape"]) != 1 for n in inner):
            return
        where = scores.where
        if scores.add is not None:
            # attention_bias = Where(Not(mask), finfo.min, Reshape(rel, [B, H, S, S])): the relative terms
            # with the padding mask, in the nodes the graph already has. The Reshape's shape may be computed
            # from Shape(scores), which has the shape of rel: its readers now read rel.
            for reader in input_name_to_nodes.get(scores.add.output[0], []):
                OnnxModel.replace_node_input(reader, scores.add.output[0], scores.rel)
        else:
            # attention_bias = Where(Not(mask), finfo.min, 0): the padding mask alone, [B, 1, S, S]
            if self.zero is None:
                self.zero = self.model.create_node_name("deberta_zero_bias")
                self.add_initializer(self.zero, TensorProto.FLOAT, [], [0.0])
            OnnxModel.replace_node_input(where, where.input[2], self.zero)
        mha = helper.make_node(
            "MultiHeadAttention",
            inputs=[scores.q_reshape.input[0], scores.k_reshape.input[0], v_reshape.input[0], "", "", where.output[0]],
            outputs=[tail[-1].output[0]],
            name=self.model.create_node_name("MultiHeadAttention", "DebertaV2Attention"),
            domain="com.microsoft",
            num_heads=heads[0],
            scale=1.0 / divisor,
        )
        self.nodes_to_add.append(mha)
        self.node_name_to_graph_name[mha.name] = self.this_graph_name
        self.add_nodes_to_remove([softmax, *inner, *tail])
        self.increase_counter("MultiHeadAttention")

def fuse(onnx_model: OnnxModel, spec=None) -> int:
    """Fuse every DeBERTa-v2 attention block of ``onnx_model`` in place; the number fused."""
    fusion = FusionDebertaV2Attention(onnx_model)
    fusion.apply()
    return fusion.fused_count["MultiHeadAttention"]
