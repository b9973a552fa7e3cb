"""Any causal LM transformers loads, exported with its KV cache by torch's dynamo exporter.

The graph takes ``input_ids``, ``attention_mask``, ``position_ids`` and ``past_key_values.{i}.key`` /
``.value`` (batch, kv_heads, past, head_dim) and returns ``logits`` and ``present.{i}.key`` / ``.value``
(batch, kv_heads, past + new, head_dim): the split layout optimum's ``text-generation-with-past`` wrote,
which :mod:`xformopt.runtime.decoder` reads. This replaces optimum's ``main_export`` for decoders the
genai builder does not know (optimum cannot be installed beside transformers 5).

transformers 5 passes the cache as a ``DynamicCache`` object; the wrapper rebuilds one from the flat
past tensors (``DynamicCache(ddp_cache_data=...)``: every layer a plain ``DynamicLayer``, so a sliding
window layer keeps its whole past and the window lives in the attention mask, as the runner expects
present = past + new) and flattens ``cache.layers[i].keys/values`` back out.

torch.export specialises sizes 0 and 1, so the sample has batch 2, 3 new tokens and a past of 4; the
parity check of :mod:`.export` then runs batch 1, a zero-length past and left-padded batches.

onnxscript's ORT fusions run in ``fuse`` (the graph is marked as a dynamo export, as the encoders'
are), and :func:`fusion_record` says which fused and which did not.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from pathlib import Path

from xformopt.families import refuse_unexportable_cache

EXPORTER_KEY = "xformopt.exporter"  # the metadata entry the fuse pass reads (xformopt/passes/export_dynamo.py)
SAMPLE_BATCH, SAMPLE_NEW, SAMPLE_PAST = 2, 3, 4


def _wrapper(model, layers: int):
    import torch
    from transformers import DynamicCache

    class _SplitPast(torch.nn.Module):
        """(input_ids, attention_mask, position_ids, *past) -> (logits, *present), optimum's split layout."""

        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, position_ids, *past):
            cache = DynamicCache(ddp_cache_data=[(past[2 * i], past[2 * i + 1]) for i in range(layers)])
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             past_key_values=cache, use_cache=True)
            presents = []
            for layer in out.past_key_values.layers[:layers]:
                presents += [layer.keys, layer.values]
            return (out.logits, *presents)

    return _SplitPast(model).eval()


def cache_shapes(model) -> list[tuple[int, int]]:
    """(kv heads, head dim) of every layer's cache, read from one tiny cached forward: layers may differ
    (Gemma 4's full-attention layers have their own head_dim and KV heads)."""
    import torch
    from transformers import DynamicCache

    with torch.no_grad():
        out = model(input_ids=torch.zeros((1, 2), dtype=torch.int64), past_key_values=DynamicCache(), use_cache=True)
    return [(int(layer.keys.shape[1]), int(layer.keys.shape[3])) for layer in out.past_key_values.layers]


def _sample(shapes: list[tuple[int, int]], vocab: int):
    import torch

    total = SAMPLE_PAST + SAMPLE_NEW
    ids = torch.randint(0, max(vocab, 2), (SAMPLE_BATCH, SAMPLE_NEW), dtype=torch.int64)
    mask = torch.ones((SAMPLE_BATCH, total), dtype=torch.int64)
    positions = torch.arange(SAMPLE_PAST, total, dtype=torch.int64)[None].expand(SAMPLE_BATCH, -1).contiguous()
    past = [torch.randn(SAMPLE_BATCH, heads, SAMPLE_PAST, dim) * 0.1 for heads, dim in shapes for _ in "kv"]
    return ids, mask, positions, past


def export_dynamo_decoder(src: Path, dst: Path, opset: int, trust_remote_code: bool = False) -> None:
    """Write ``dst/model.onnx`` (weights in ``model.onnx.data``) for the causal LM in ``src``."""
    import torch
    from torch.export import Dim
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(src, trust_remote_code=trust_remote_code)
    refuse_unexportable_cache(config.get_text_config(decoder=True).to_dict())
    # eager attention: plain MatMul/Softmax ops that onnxscript's SDPA -> GQA/MHA rules match
    model = AutoModelForCausalLM.from_pretrained(src, trust_remote_code=trust_remote_code, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    shapes = cache_shapes(model)
    layers = len(shapes)
    ids, mask, positions, past = _sample(shapes, model.config.get_text_config().vocab_size)
    # Dim.DYNAMIC: torch infers how the axes relate (total = past + new); named after export (_name_axes)
    dyn = Dim.DYNAMIC
    axes = ({0: dyn, 1: dyn}, {0: dyn, 1: dyn}, {0: dyn, 1: dyn}, tuple([{0: dyn, 2: dyn}] * (2 * layers)))  # *past: one tuple
    past_names = [f"past_key_values.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    present_names = [f"present.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    # the exporter prints its progress on stdout: kept off ours (the CLI may write JSON there)
    with warnings.catch_warnings(), torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            _wrapper(model, layers), (ids, mask, positions, *past), dynamic_shapes=axes, opset_version=opset,
            input_names=["input_ids", "attention_mask", "position_ids", *past_names],
            output_names=["logits", *present_names], dynamo=True, optimize=True, external_data=True)
    _finish(program, dst / "model.onnx")


def _finish(program, path: Path) -> None:
    """Name the weighted MatMuls, mark the graph as a dynamo export (the fuse pass runs onnxscript's ORT
    fusions on such graphs) and save it with its weights in one external file."""
    _name_matmuls(program.model)
    program.model.metadata_props[EXPORTER_KEY] = "dynamo"
    program.save(str(path), external_data=True)


def _name_matmuls(model) -> None:
    """``node_linear_7`` -> ``/model/layers.0/self_attn/q_proj/MatMul``, from the module scope torch records
    on each node: the names optimum gave, which the int4 pass's roles (lm_head, q_proj, down_proj, ...) and
    its records read."""
    import ast

    used = {node.name for node in model.graph}
    for node in model.graph:
        scopes = node.metadata_props.get("pkg.torch.onnx.name_scopes")
        if node.op_type not in ("MatMul", "Gemm") or not scopes:
            continue
        path = [s for s in ast.literal_eval(scopes) if s][:-1]  # module paths, then the fx node's own name
        if not path:
            continue
        module = path[-1].removeprefix("model.")  # the export wrapper's own attribute
        name = "/" + module.replace(".", "/").replace("/layers/", "/layers.") + f"/{node.op_type}"
        if name not in used:
            used.add(name)
            node.name = name
