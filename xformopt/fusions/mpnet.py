"""MPNet self-attention into ONNX Runtime's fused ``com.microsoft.MultiHeadAttention``.

ORT's BERT fuser matches no MPNet layer: MPNet adds a relative position bias to the attention
scores, which the BERT pattern does not expect. The TorchScript export of one layer is::

    x ─ MatMul ─ Add ─ Reshape ─ Transpose(0,2,1,3) ─┐                      (Q)
    x ─ MatMul ─ Add ─ Reshape ─ Transpose(0,2,3,1) ─ MatMul ─ Div ─ Add(position bias) ─ Add(mask) ─ Softmax
                                        (a dynamo export: one FusedMatMul with alpha = 1 / divisor)
    x ─ MatMul ─ Add ─ Reshape ─ Transpose(0,2,1,3) ─────────────────────────────────────────── MatMul(probs, V)
                                                          ─ Transpose(0,2,1,3) ─ Reshape ─> output projection

which this fusion rewrites into the Q/K/V MatMuls (kept, so dynamic INT8 quantizes them), one
MultiHeadAttention with their biases packed into its ``bias`` input, and the position bias plus the
padding mask as its ``attention_bias`` [B, heads, S, S]. The bucketed position bias stays in the graph
(it depends on the sequence length) and, as in MPNet, is computed once per forward: the sum with the
mask is one node shared by every layer.

Why MultiHeadAttention and not ``Attention`` (packed QKV): dynamic quantization rewrites ``Attention``
into ``QAttention``, which has no attention-bias input (ORT's AttentionQuant drops it), so the
position bias would be lost silently in an INT8 graph.
"""

from __future__ import annotations

import logging

from onnx import NodeProto, helper, numpy_helper
from onnxruntime.transformers.fusion_attention import FusionAttention
from onnxruntime.transformers.onnx_model import OnnxModel

logger = logging.getLogger(__name__)

# (op types, input indices) from the scores MatMul / the context MatMul to one projection.
_PROJECTION = (["Transpose", "Reshape", "Add", "MatMul"], [None, 0, None, None])
_HEADS_FIRST = [0, 2, 1, 3]  # [B, S, N, H] -> [B, N, S, H] (Q, V, and the context back)
_KEY_TRANSPOSED = [0, 2, 3, 1]  # [B, S, N, H] -> [B, N, H, S] (K, already transposed for Q x K^T)


class FusionMPNetAttention(FusionAttention):
    """ORT's attention fusion, searched from each Softmax, for MPNet's relative-position-biased scores."""

    def __init__(self, model: OnnxModel, hidden_size: int, num_heads: int):
        super().__init__(model, hidden_size, num_heads, use_multi_head_attention=True, search_op_types=["Softmax"])
        self.attention_biases: dict[tuple[str, str], str] = {}  # (position bias, mask) -> their shared sum

    def _perm(self, node: NodeProto) -> list[int] | None:
        return OnnxModel.get_node_attribute(node, "perm")

    def _projection(self, node: NodeProto, index: int, perm: list[int], output_name_to_node) -> list | None:
        path = self.model.match_parent_path(node, _PROJECTION[0], [index, *_PROJECTION[1][1:]], output_name_to_node)
        if path is None or self._perm(path[0]) != perm:
            return None
        return path

    def _heads_from_weights(self, q_reshape: NodeProto, q_matmul: NodeProto) -> tuple[int, int]:
        """(heads, attention width) of a layer whose Reshape gives only the head size: the query projection's
        output width over it. (0, 0) when either is not a constant."""
        shape = self.model.get_constant_value(q_reshape.input[1])
        if shape is None:
            concat = self.model.get_parent(q_reshape, 1)
            size = self.model.get_constant_value(concat.input[-1]) if concat is not None and concat.op_type == "Concat" \
                else None
        else:
            size = shape[-1:] if len(shape) == 4 else None
        weight = next((w for w in (self.model.get_initializer(i) for i in q_matmul.input) if w is not None), None)
        if size is None or getattr(size, "size", 0) != 1 or weight is None or int(size[0]) <= 0:
            return 0, 0
        width = int(numpy_helper.to_array(weight).shape[-1])
        return (width // int(size[0]), width) if width % int(size[0]) == 0 else (0, 0)

    def _attention_bias(self, position_bias: str, mask: str) -> str:
        """position bias + padding mask, one Add for all layers (both are computed once per forward)."""
        key = (position_bias, mask)
        if key not in self.attention_biases:
            name = self.model.create_node_name("Add", "MPNetAttentionBias")
            node = helper.make_node("Add", [position_bias, mask], [name + "_output"], name=name)
            self.nodes_to_add.append(node)
            self.node_name_to_graph_name[name] = self.this_graph_name
            self.attention_biases[key] = node.output[0]
        return self.attention_biases[key]

    def _scores(self, softmax: NodeProto, output_name_to_node):
        """((mask Add, mask), (position Add, position bias), Q x K^T node, [Div] or [], divisor) or None."""
        for ops, indices in ((["Add", "Add", "Div", "MatMul"], [0, None, None, 0]), (["Add", "Add", "FusedMatMul"], [0, None, None])):
            which: list[int] = []
            path = self.model.match_parent_path(softmax, ops, indices, output_name_to_node, return_indice=which)
            if path is None:
                continue
            add_mask, add_position = path[0], path[1]
            if path[2].op_type == "Div":
                divisor = self.model.get_constant_value(path[2].input[1])
                if divisor is None or getattr(divisor, "size", 1) != 1 or float(divisor) <= 0:
                    return None
                scaling, qk = [path[2]], path[3]
            else:
                qk = path[2]
                alpha = OnnxModel.get_node_attribute(qk, "alpha")
                if any(OnnxModel.get_node_attribute(qk, a) not in (None, 0) for a in ("transA", "transB", "transBatchA",
                                                                                     "transBatchB")):
                    return None
                if alpha is None or float(alpha) <= 0:
                    return None
                scaling, divisor = [], 1.0 / float(alpha)
            return ((add_mask, add_mask.input[1 - which[0]]), (add_position, add_position.input[1 - which[1]]),
                    qk, scaling, divisor)
        return None

    def fuse(self, softmax: NodeProto, input_name_to_nodes, output_name_to_node):
        axis = OnnxModel.get_node_attribute(softmax, "axis")
        if axis not in (None, -1, 3):  # opset >= 13 default is -1
            return
        # Scores: ((Q x K^T) / sqrt(head size) + position bias) + mask, the two Adds in either input order.
        # The TorchScript export divides after the MatMul; on a dynamo export onnxscript has folded the
        # scale into one FusedMatMul (alpha = 1 / sqrt(head size)).
        scores = self._scores(softmax, output_name_to_node)
        if scores is None:
            return
        (add_mask, mask), (add_position, position_bias), qk, scaling, divisor = scores

        q_path = self._projection(qk, 0, _HEADS_FIRST, output_name_to_node)
        k_path = self._projection(qk, 1, _KEY_TRANSPOSED, output_name_to_node)
        children = input_name_to_nodes.get(softmax.output[0], [])
        if q_path is None or k_path is None or len(children) != 1 or children[0].op_type != "MatMul":
            return
        context = children[0]
        if context.input[0] != softmax.output[0]:
            return
        v_path = self._projection(context, 1, _HEADS_FIRST, output_name_to_node)
        out_transpose = self.model.find_first_child_by_type(context, "Transpose", input_name_to_nodes, recursive=False)
        if v_path is None or out_transpose is None or self._perm(out_transpose) != _HEADS_FIRST:
            return
        out_reshape = self.model.find_first_child_by_type(out_transpose, "Reshape", input_name_to_nodes,
                                                          recursive=False)
        if out_reshape is None:
            return
        (q_t, q_reshape, q_add, q_matmul), (k_t, k_reshape, k_add, k_matmul), (v_t, v_reshape, v_add, v_matmul) = (
            q_path, k_path, v_path)
        if not (q_matmul.input[0] == k_matmul.input[0] == v_matmul.input[0]):
            return  # self-attention only
        if any(self.model.get_initializer(a.input[0]) is None and self.model.get_initializer(a.input[1]) is None
               for a in (q_add, k_add, v_add)):
            return  # the packed bias input needs the projection biases as constants

        num_heads, hidden_size = self.get_num_heads_and_hidden_size(q_reshape)
        if num_heads <= 0:  # MPNet reshapes to (-1 heads, head size): a head-pruned layer's count is in its weights
            num_heads, hidden_size = self._heads_from_weights(q_reshape, q_matmul)
        if num_heads <= 0 or hidden_size <= 0 or hidden_size % num_heads:
            return

        removed = [softmax, add_mask, add_position, *scaling, qk, context, out_transpose, out_reshape,
                   q_t, q_reshape, q_add, k_t, k_reshape, k_add, v_t, v_reshape, v_add]
        if not self.model.is_safe_to_fuse_nodes(removed, out_reshape.output, input_name_to_nodes, output_name_to_node):
            return

        mha = self.create_multihead_attention_node(
            q_matmul, k_matmul, v_matmul, q_add, k_add, v_add, int(num_heads), int(hidden_size),
            out_reshape.output[0], add_qk=self._attention_bias(position_bias, mask),
        )
        if mha is None:
            return
        # The exported divisor is sqrt(head size), MHA's default; written out so any other stays exact.
        mha.attribute.append(helper.make_attribute("scale", 1.0 / float(divisor)))
        self.nodes_to_add.append(mha)
        self.node_name_to_graph_name[mha.name] = self.this_graph_name
        self.nodes_to_remove.extend(removed)
        self.prune_graph = True  # the per-layer shape subgraphs (Shape/Concat for the Reshapes) go too


def fuse(onnx_model: OnnxModel, spec) -> int:
    """The family hook (families.own_fusion): fuse every MPNet attention block in ``onnx_model``.

    Returns how many blocks fused; the fuse pass counts MultiHeadAttention nodes itself and its
    ``expect_full`` fails when a layer did not fuse."""
    # 0: read each layer's heads and width from its Reshape (pruned models differ per layer).
    heads, hidden = (0, 0) if getattr(spec, "pruned", False) else (spec.num_heads, spec.hidden_size)
    fusion = FusionMPNetAttention(onnx_model, hidden, heads)
    fusion.apply()
    onnx_model.topological_sort()  # the fused nodes were appended after the graph ORT sorted
    fused = fusion.fused_count.get("MultiHeadAttention", 0)
    logger.info("MPNet attention: fused %d MultiHeadAttention", fused)
    return fused
