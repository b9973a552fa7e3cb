"""DeBERTa-v2/v3 attention -> ``com.microsoft.MultiHeadAttention``, in ONNX Runtime's ``Fusion`` style.

ORT's optimizer has no DeBERTa fuser (optimum routes the family to the BERT one, which matches only the
layer norms). DeBERTa's disentangled attention adds content->position and position->content terms to
the scores; both are gathers over relative-position buckets computed from Q, K and the (shared)
relative embeddings, which no ORT kernel computes. So this fusion keeps that subgraph as it is and
fuses only the core around it (per layer, as optimum's TorchScript export writes it)::

    scores = MatMul(Q_heads, Div(K_heads^T, sqrt(d * scale_factor))) + rel      [B*H, S, S]
    probs  = Softmax(Where(Not(mask), finfo.min, Reshape(scores, [B, H, S, S])))
    ctx    = Reshape(Transpose(Reshape(MatMul(Reshape(probs), V_heads))))     [B, S, H*d]

becomes ``MultiHeadAttention(q, k, v, attention_bias=Where(Not(mask), finfo.min, Reshape(rel)))`` with
``scale = 1 / sqrt(d * scale_factor)``: the relative terms, padding mask folded in, are the attention
bias, so the graph computes exactly the same sum before the softmax. Written by hand because no
library fuses this (onnxscript's rewriter has no DeBERTa rule either).
"""

from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto, helper
from onnxruntime.transformers.fusion_base import Fusion
from onnxruntime.transformers.onnx_model import OnnxModel


class FusionDebertaV2Attention(Fusion):
    def __init__(self, model: OnnxModel):
        super().__init__(model, "MultiHeadAttention", "Softmax", "DeBERTa-v2 disentangled attention")
        self.prune_graph = True  # the shape subgraphs of the removed Reshapes become dead
        self.zero: str | None = None  # the scalar 0 bias shared by layers without relative attention

    def _const(self, name: str):
        value = self.model.get_constant_value(name)
        return None if value is None else np.asarray(value)

    def _heads(self, reshape, output_name_to_node) -> tuple[int, int] | None:
        """(heads, head size) of a [B, S, H, d] Reshape: H from its constant shape ([0, 0, H, -1] or
        [0, 0, H, d]), d from the shape or from the width of the projection it reshapes."""
        shape = self._const(reshape.input[1])
        if shape is None or shape.size != 4 or shape[2] <= 0:
            return None
        heads, size = int(shape[2]), int(shape[3])
        if size <= 0:
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

    def fuse(self, softmax, input_name_to_nodes, output_name_to_node):
        model = self.model
        # Before the softmax: the padding mask's Where over the scores reshaped to [B, H, S, S].
        where = model.match_parent(softmax, "Where", 0, output_name_to_node)
        fill = None if where is None else self._const(where.input[1])
        if fill is None or fill.size != 1 or float(fill.reshape(())) > -1e4:  # not a padding mask's fill
            return
        to_4d = model.match_parent(where, "Reshape", 2, output_name_to_node)
        if to_4d is None:
            return
        scores = output_name_to_node.get(to_4d.input[0])
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
            return
        q_path = model.match_parent_path(qk, ["Reshape", "Transpose", "Reshape"], [0, 0, 0], output_name_to_node)
        k_path = model.match_parent_path(
            qk, ["Div", "Transpose", "Reshape", "Transpose", "Reshape"], [1, 0, 0, 0, 0], output_name_to_node)
        if q_path is None or k_path is None:
            return
        div, k_transpose = k_path[0], k_path[1]

        # After the softmax: probs x V, then back to [B, S, H*d].
        children = [c for c in input_name_to_nodes.get(softmax.output[0], []) if c.op_type != "Shape"]
        if len(children) != 1 or children[0].op_type != "Reshape":
            return
        probs_3d = children[0]
        pv = [c for c in input_name_to_nodes.get(probs_3d.output[0], [])]
        if len(pv) != 1 or pv[0].op_type != "MatMul" or pv[0].input[0] != probs_3d.output[0]:
            return
        pv = pv[0]
        tail = []
        node = pv
        for op in ("Reshape", "Transpose", "Reshape"):
            nexts = [c for c in input_name_to_nodes.get(node.output[0], []) if c.op_type != "Shape"]
            if len(nexts) != 1 or nexts[0].op_type != op:
                return
            node = nexts[0]
            tail.append(node)
        v_path = model.match_parent_path(pv, ["Reshape", "Transpose", "Reshape"], [1, 0, 0], output_name_to_node)
        if v_path is None:
            return

        heads = self._heads(q_path[2], output_name_to_node)
        if heads is None or any(heads != self._heads(p, output_name_to_node) for p in (k_path[4], v_path[2])):
            return
        num_heads, head_size = heads
        if list(model.get_node_attribute(tail[1], "perm") or []) != [0, 2, 1, 3]:
            return
        folded = self._const(div.input[1])
        if folded is not None and folded.size == 1:
            divisor = float(folded.reshape(()))
        else:
            factor = self._scale_factor(div.input[1], output_name_to_node)
            if factor is None:
                return
            divisor = math.sqrt(head_size * factor)

        # K^T and Q.K^T are needed only by the scores: anything else reading them (there is nothing in
        # DeBERTa's graph) would lose its input.
        for inner in (div, k_transpose, qk, add):
            readers = [c for c in input_name_to_nodes.get(inner.output[0], []) if c.op_type != "Shape"] if inner else [1]
            if len(readers) != 1:
                return

        if add is not None:
            # attention_bias = Where(Not(mask), finfo.min, Reshape(rel, [B, H, S, S])): the relative terms
            # with the padding mask, in the nodes the graph already has. The Reshape's shape is computed
            # from Shape(scores), which has the shape of rel: its readers now read rel.
            for reader in input_name_to_nodes.get(add.output[0], []):
                OnnxModel.replace_node_input(reader, add.output[0], rel)
        else:
            # attention_bias = Where(Not(mask), finfo.min, 0): the padding mask alone, [B, 1, S, S]
            if self.zero is None:
                self.zero = self.model.create_node_name("deberta_zero_bias")
                self.add_initializer(self.zero, TensorProto.FLOAT, [], [0.0])
            OnnxModel.replace_node_input(where, where.input[2], self.zero)
        out_name = tail[2].output[0]
        mha = helper.make_node(
            "MultiHeadAttention",
            inputs=[q_path[2].input[0], k_path[4].input[0], v_path[2].input[0], "", "", where.output[0]],
            outputs=[out_name],
            name=model.create_node_name("MultiHeadAttention", "DebertaV2Attention"),
            domain="com.microsoft",
            num_heads=num_heads,
            scale=1.0 / divisor,
        )
        self.nodes_to_add.append(mha)
        self.node_name_to_graph_name[mha.name] = self.this_graph_name
        self.add_nodes_to_remove([n for n in (qk, div, k_transpose, add, softmax, probs_3d, pv, *tail) if n])
        self.increase_counter("MultiHeadAttention")


def fuse(onnx_model: OnnxModel, spec=None) -> int:
    """Fuse every DeBERTa-v2 attention block of ``onnx_model`` in place; the number fused."""
    fusion = FusionDebertaV2Attention(onnx_model)
    fusion.apply()
    return fusion.fused_count["MultiHeadAttention"]
