"""Fused attention per layer, op counts, INT8 ops and initializer comparison of artifacts' model.onnx.
    python graph_info.py ARTIFACT...   (the first is the reference for the initializer comparison)"""
import collections
import hashlib
import sys

import onnx
from onnx import numpy_helper


def info(path):
    m = onnx.load(f"{path}/model.onnx")
    g = m.graph
    prod = {o: n for n in g.node for o in n.output}
    ops = collections.Counter(n.op_type for n in g.node)
    att = collections.defaultdict(collections.Counter)
    attrs = {}
    # layer = how many SkipLayerNormalization/LayerNormalization nodes lie on the path back to the embeddings,
    # halved (each encoder layer has two): counted along the attention's first input
    def norms_before(name):
        count, seen = 0, set()
        while name in prod and name not in seen:
            seen.add(name); n = prod[name]
            if n.op_type in ("SkipLayerNormalization", "LayerNormalization"):
                count += 1
            if n.op_type == "EmbedLayerNormalization":
                break
            name = n.input[0]
        return count
    for n in g.node:
        if n.op_type in ("Attention", "MultiHeadAttention", "QAttention", "PackedAttention", "GroupQueryAttention"):
            att[norms_before(n.input[0]) // 2][n.op_type] += 1
            attrs.setdefault(n.op_type, {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute})
    return m, ops, att, attrs

def digest(t):
    a = numpy_helper.to_array(t)
    return (str(a.dtype), a.shape, hashlib.sha1(a.tobytes()).hexdigest())

ref = None
for p in sys.argv[1:]:
    m, ops, att, attrs = info(p)
    print(f"== {p}: {len(m.graph.node)} nodes, {len(m.graph.initializer)} initializers, opsets "
          + ", ".join(f"{o.domain or 'ai.onnx'}:{o.version}" for o in m.opset_import))
    print("  fused attention per layer: " + "; ".join(f"layer {k}: " + ",".join(f"{t} {c}" for t, c in v.items())
                                                     for k, v in sorted(att.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))))
    for t, a in attrs.items():
        print(f"  {t} attributes: {a}")
    print("  ops: " + ", ".join(f"{k} {v}" for k, v in sorted(ops.items())))
    int8 = {k: v for k, v in ops.items() if k in ("MatMulInteger", "DynamicQuantizeLinear", "QuantizeLinear", "DequantizeLinear",
                                                  "QLinearMatMul", "MatMulIntegerToFloat", "DynamicQuantizeMatMul", "QAttention",
                                                  "ConvInteger", "QGemm", "DynamicQuantizeLSTM") or k.startswith("QLinear")}
    print(f"  INT8 ops: {int8}; float MatMul left: {ops.get('MatMul', 0)}, Gemm {ops.get('Gemm', 0)}")
    dt = collections.Counter(onnx.TensorProto.DataType.Name(i.data_type) for i in m.graph.initializer)
    print(f"  initializer dtypes: {dict(dt)}")
    d = collections.Counter(digest(i) for i in m.graph.initializer)
    if ref is None:
        ref = (p, d)
    else:
        common = sum((d & ref[1]).values())
        print(f"  initializers identical (value, dtype, shape) to {ref[0]}'s: {common} of {sum(ref[1].values())}; "
              f"{sum(d.values()) - common} of this graph's {sum(d.values())} not in it")
