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

A linear-attention layer (Qwen3.5's Gated DeltaNet) has no key/value pair: its conv and recurrent states
travel as ``past_key_values.{i}.conv`` / ``.recurrent`` (fixed size, zeros at step 0).

torch.export specialises sizes 0 and 1, so the sample has batch 2, 3 new tokens and a past of 4; the
parity check of :mod:`.export` then runs batch 1, a zero-length past and left-padded batches.

onnxscript's ORT fusions run in ``fuse`` (the graph is marked as a dynamo export, as the encoders'
are), and :func:`fusion_record` says which fused and which did not.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from pathlib import Path

from xformopt.families import refuse_unexportable_cache
from xformopt.models.cache_names import cache_kwargs, output_cache
from xformopt.models.quiet import load_quietly

EXPORTER_KEY = "xformopt.exporter"  # the metadata entry the fuse pass reads (xformopt/passes/export/dynamo.py)
SAMPLE_BATCH, SAMPLE_NEW, SAMPLE_PAST = 2, 3, 4

_log = logging.getLogger(__name__)
LOOP_NOTE = "linear attention's triangular solves as ONNX Loops (xformopt.passes.export.triangular_solve)"


def loop_solves(model):
    """:func:`xformopt.passes.export.triangular_solve.loop_solves`, imported when an export runs: onnxscript,
    which it needs at import, would otherwise more than double the command line's start-up."""
    from xformopt.passes.export.triangular_solve import loop_solves as solves

    return solves(model)


def _layer_cache(layer_cache, tensors: list):
    """Fill one layer of a transformers cache from the graph's past tensors for it."""
    if len(tensors) == 2 and hasattr(layer_cache, "keys"):
        layer_cache.update(tensors[0], tensors[1])
        return
    # A linear-attention layer (Qwen3.5's Gated DeltaNet): its conv and recurrent states, marked as carried
    # over, so every step (step 0 with zero states, which equal the prompt's zero padding) takes the
    # cached path. Cloned: the layer updates them in place, and graph inputs must stay unmutated.
    conv, recurrent = (t.clone() for t in tensors)
    layer_cache.conv_states[0], layer_cache.recurrent_states[0] = conv, recurrent
    layer_cache.conv_kernel_size[0] = conv.shape[-1]
    layer_cache.dtype, layer_cache.device = conv.dtype, conv.device
    for flags in (layer_cache.is_conv_states_initialized, layer_cache.is_recurrent_states_initialized,
                  layer_cache.has_previous_state):
        flags[0] = True


def _layer_outputs(layer_cache, kinds: tuple[str, ...]) -> list:
    if kinds == KV:
        return [layer_cache.keys, layer_cache.values]
    return [layer_cache.conv_states[0], layer_cache.recurrent_states[0]]


def _wrapper(model, slots: list[tuple[str, ...]]):
    import torch
    from transformers import DynamicCache

    config = model.config

    class _SplitPast(torch.nn.Module):
        """(input_ids, attention_mask, position_ids, *past) -> (logits, *present), optimum's split layout."""

        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, position_ids, *past):
            stateful = any(kinds != KV for kinds in slots)
            # plain DynamicLayers (no config) unless a layer keeps state: a sliding layer then keeps its whole
            # past (the window is in the mask), as the runner expects present = past + new
            cache = DynamicCache(config=config) if stateful else DynamicCache()
            tensors = iter(past)
            for i, kinds in enumerate(slots):
                if stateful:
                    _layer_cache(cache.layers[i], [next(tensors) for _ in kinds])
                else:
                    cache.update(next(tensors), next(tensors), i)
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             **cache_kwargs(self.model, cache), use_cache=True)
            presents = []
            for layer, kinds in zip(output_cache(out).layers, slots):
                presents += _layer_outputs(layer, kinds)
            return (out.logits, *presents)

    return _SplitPast(model).eval()


KV, STATES = ("key", "value"), ("conv", "recurrent")


def cache_slots(model) -> tuple[list[tuple[str, ...]], list[tuple[int, ...]]]:
    """Per layer, what it caches (``key``/``value``, or a linear-attention layer's ``conv``/``recurrent``
    states), and the shape of each tensor without its batch axis, read from one tiny cached forward:
    layers may differ (Gemma 4's full-attention layers have their own head_dim and KV heads)."""
    import torch
    from transformers import DynamicCache

    config = model.config.get_text_config(decoder=True)
    stateful = "linear_attention" in (getattr(config, "layer_types", None) or ())
    with torch.no_grad():
        out = model(input_ids=torch.zeros((1, 2), dtype=torch.int64), use_cache=True,
                    **cache_kwargs(model, DynamicCache(config=model.config) if stateful else DynamicCache()))
    slots, shapes = [], []
    for layer in output_cache(out).layers:
        if getattr(layer, "keys", None) is not None:
            slots.append(KV)
            shapes += [tuple(layer.keys.shape[1:]), tuple(layer.values.shape[1:])]
        else:
            slots.append(STATES)
            shapes += [tuple(layer.conv_states[0].shape[1:]), tuple(layer.recurrent_states[0].shape[1:])]
    return slots, shapes


def _sample(slots, shapes, vocab: int):
    import torch

    total = SAMPLE_PAST + SAMPLE_NEW
    ids = torch.randint(0, max(vocab, 2), (SAMPLE_BATCH, SAMPLE_NEW), dtype=torch.int64)
    mask = torch.ones((SAMPLE_BATCH, total), dtype=torch.int64)
    positions = torch.arange(SAMPLE_PAST, total, dtype=torch.int64)[None].expand(SAMPLE_BATCH, -1).contiguous()
    kinds = [kind for layer in slots for kind in layer]
    past = []
    for kind, shape in zip(kinds, shapes):
        if kind in KV:
            shape = (shape[0], SAMPLE_PAST, *shape[2:])
        past.append(torch.randn(SAMPLE_BATCH, *shape) * 0.1)
    return ids, mask, positions, past


def export_dynamo_decoder(src: Path, dst: Path, opset: int, trust_remote_code: bool = False) -> str | None:
    """Write ``dst/model.onnx`` (weights in ``model.onnx.data``) for the causal LM in ``src``; returns
    :data:`LOOP_NOTE` when linear-attention solves were written as Loops (:mod:`.triangular_solve`)."""
    import torch
    from torch.export import Dim
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(src, trust_remote_code=trust_remote_code)
    refuse_unexportable_cache(config.get_text_config(decoder=True).to_dict())
    # eager attention: plain MatMul/Softmax ops that onnxscript's SDPA -> GQA/MHA rules match
    model = load_quietly(AutoModelForCausalLM.from_pretrained, src, trust_remote_code=trust_remote_code, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    slots, shapes = cache_slots(model)
    ids, mask, positions, past = _sample(slots, shapes, model.config.get_text_config().vocab_size)
    # Dim.DYNAMIC: torch infers how the axes relate (total = past + new). States are fixed-size but batch.
    dyn = Dim.DYNAMIC
    kinds = [kind for layer in slots for kind in layer]
    past_axes = tuple({0: dyn, 2: dyn} if kind in KV else {0: dyn} for kind in kinds)
    axes = ({0: dyn, 1: dyn}, {0: dyn, 1: dyn}, {0: dyn, 1: dyn}, past_axes)  # *past: one tuple
    past_names = [f"past_key_values.{i}.{kind}" for i, layer in enumerate(slots) for kind in layer]
    present_names = [f"present.{i}.{kind}" for i, layer in enumerate(slots) for kind in layer]

    def export(table: dict):
        # the exporter prints its progress on stdout: kept off ours (the CLI may write JSON there)
        with warnings.catch_warnings(), torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            return torch.onnx.export(
                _wrapper(model, slots), (ids, mask, positions, *past), dynamic_shapes=axes, opset_version=opset,
                input_names=["input_ids", "attention_mask", "position_ids", *past_names],
                output_names=["logits", *present_names], custom_translation_table=table or None, dynamo=True,
                optimize=True, external_data=True)

    program, note = None, None
    with loop_solves(model) as table:
        if table:
            try:
                program, note = export(table), LOOP_NOTE
            except Exception as exc:  # noqa: BLE001 - the modelling code's own (unrolled) export form then
                _log.warning(f"linear attention's solve could not be written as a Loop ({type(exc).__name__}: "
                             f"{exc}); exporting the modelling code's unrolled form")
    _finish(program if program is not None else export({}), dst / "model.onnx")
    return note


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
