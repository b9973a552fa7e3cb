"""Causal LMs exported by torch's dynamo exporter with their attention written as ONNX Runtime's
``GroupQueryAttention``: the layout onnxruntime-genai's builder writes, for families it does not build.

Pattern-matching the exported attention back into GroupQueryAttention fails on every family that
departs from Llama (onnxscript's GQA rule wants an older causal-mask graph; Ministral 3's
position-dependent query scale defeats even its SDPA rule). Instead the attention is replaced at its
source: transformers calls attention through ``AttentionInterface``, so the export registers an
implementation that calls one custom torch op per layer, translated to
``com.microsoft::GroupQueryAttention`` (``do_rotary=1``, the layer's ``cos_cache``/``sin_cache``,
``local_window_size`` for sliding layers, ``softcap``) and fed straight from the graph's past tensors.
The model's own rotary is switched off while it is traced (``apply_rotary_pos_emb`` -> identity), and
the tables GroupQueryAttention rotates with are the model's rotary module evaluated at every position
up to ``max_position_embeddings`` (its scaling included: YaRN, Gemma 4's per-layer-type ropes).
Everything before the attention (q/k norms, Ministral 3's query scale, which commutes with a rotation)
stays transformers' own code.

Inputs: ``input_ids``, ``attention_mask``, ``past_key_values.{i}.key/value`` (no ``position_ids``);
positions, ``seqlens_k = sum(mask) - 1`` and ``total_sequence_length = mask width`` are computed in the
graph from the mask, as the builder's graphs do. Rows are right-padded or unpadded (the runner's
contract for GroupQueryAttention graphs), so ``xformopt serve`` batches sequences continuously
(:mod:`xformopt.runtime.batch_decoder`), past and present sharing one buffer.

Refused (the caller falls back to the plain dynamo export, :mod:`.decoder_dynamo`): layers that keep
state other than a key/value pair (Qwen3.5's Gated DeltaNet), layers that reuse another layer's key/value
(Gemma 4's ``num_kv_shared_layers``), rotary tables whose halves differ (interleaved rotary), attention
with sink logits (GPT-OSS), a model without one ``*Attention`` module per layer or a rotary module.
Anything else the op would not reproduce shows in the export pass's parity check, after which the pass
re-exports with the plain dynamo exporter (:func:`xformopt.passes.export.decoder.export_decoder`).
"""

from __future__ import annotations

import contextlib
import inspect
import io
import sys
import warnings
from pathlib import Path

from xformopt.families import kv_shared_layers
from xformopt.models.quiet import load_quietly

ATTENTION_NAME = "xformopt_gqa"
SAMPLE_BATCH, SAMPLE_NEW, SAMPLE_PAST = 2, 3, 4


class NotGroupQueryAttention(ValueError):
    """This model's attention cannot be written as GroupQueryAttention (the reason is the message)."""


SCHEMA = ("(Tensor query, Tensor key, Tensor value, Tensor past_key, Tensor past_value, Tensor seqlens_k, "
          "Tensor total_length, Tensor cos, Tensor sin, int num_heads, int kv_heads, float scale, int window, "
          "float softcap) -> (Tensor, Tensor, Tensor)")
_STEP: dict = {}  # the tensors of the step being traced: past, seqlens_k, total length, presents


def _register_op():
    """The custom op (once per process): a fake implementation for tracing; it never runs eagerly."""
    import torch

    if hasattr(torch.ops.xformopt, "group_query_attention"):
        return torch.ops.xformopt.group_query_attention.default

    @torch.library.custom_op("xformopt::group_query_attention", mutates_args=(), schema=SCHEMA)
    def gqa(query, key, value, past_key, past_value, seqlens_k, total_length, cos, sin, num_heads, kv_heads, scale,
            window, softcap):
        raise NotImplementedError("xformopt::group_query_attention exists for export only")

    @gqa.register_fake
    def _(query, key, value, past_key, past_value, seqlens_k, total_length, cos, sin, num_heads, kv_heads, scale,
          window, softcap):
        batch, new, _ = query.shape
        head_dim = past_key.shape[-1]
        present = (batch, kv_heads, past_key.shape[2] + new, head_dim)
        return query.new_empty(batch, new, num_heads * head_dim), past_key.new_empty(present), past_value.new_empty(present)

    return torch.ops.xformopt.group_query_attention.default


def _schema():
    """Enough of ORT's contrib schema for onnxscript to record the node (onnx does not ship it)."""
    from onnx.defs import OpSchema

    def param(name, kind="T"):
        return OpSchema.FormalParameter(name, kind)

    inputs = [param(n) for n in ("query", "key", "value", "past_key", "past_value")]
    inputs += [param("seqlens_k", "M"), param("total_sequence_length", "M"), param("cos_cache"), param("sin_cache")]
    attrs = [OpSchema.Attribute(n, OpSchema.AttrType.INT, "") for n in ("num_heads", "kv_num_heads",
                                                                         "local_window_size", "do_rotary")]
    attrs += [OpSchema.Attribute(n, OpSchema.AttrType.FLOAT, "") for n in ("scale", "softcap")]
    return OpSchema("GroupQueryAttention", "com.microsoft", 1, inputs=inputs,
                    outputs=[param(n) for n in ("output", "present_key", "present_value")],
                    type_constraints=[("T", ["tensor(float)", "tensor(float16)"], ""), ("M", ["tensor(int32)"], "")],
                    attributes=attrs)


def _translation():
    """The op written as ``com.microsoft::GroupQueryAttention`` with the rotary inside."""
    import onnxscript

    op = onnxscript.values.Op(onnxscript.values.Opset("com.microsoft", 1), "GroupQueryAttention", _schema())

    def gqa(query, key, value, past_key, past_value, seqlens_k, total_length, cos, sin, num_heads: int,
            kv_heads: int, scale: float, window: int, softcap: float):
        return op(query, key, value, past_key, past_value, seqlens_k, total_length, cos, sin, num_heads=num_heads,
                  kv_num_heads=kv_heads, scale=scale, local_window_size=window, softcap=softcap, do_rotary=1,
                  _outputs=3)

    return gqa


def _attention(module, query, key, value, attention_mask, scaling=None, sliding_window=None, softcap=None, **_):
    """transformers' attention interface, as GroupQueryAttention over the graph's past of this layer."""
    step = _STEP
    layer = module.layer_idx
    batch, heads, new, head_dim = query.shape
    kv_heads = key.shape[1]
    cos, sin = step["tables"][layer]
    # transformers' window as the op's local_window_size, as the genai builder passes it (greedy parity on Gemma 4's
    # window-8 layers measured it: window - 1 diverges once a sequence outgrows the window)
    window = getattr(module, "sliding_window", None) or sliding_window
    out, present_key, present_value = step["op"](
        query.transpose(1, 2).reshape(batch, new, heads * head_dim),
        key.transpose(1, 2).reshape(batch, new, kv_heads * head_dim),
        value.transpose(1, 2).reshape(batch, new, kv_heads * head_dim),
        step["past"][2 * layer], step["past"][2 * layer + 1], step["seqlens_k"], step["total"], cos, sin,
        heads, kv_heads, float(scaling if scaling is not None else head_dim ** -0.5),
        int(window) if window else -1, float(softcap or 0.0))
    step["presents"][layer] = (present_key, present_value)
    return out.reshape(batch, new, heads, head_dim), None


@contextlib.contextmanager
def _rotary_off(model):
    """Every attention module's ``apply_rotary_pos_emb`` returns its tensors unrotated while tracing."""
    modules = {sys.modules[type(m).__module__] for m in model.modules() if hasattr(m, "layer_idx")}
    saved = {}
    for mod in modules:
        original = getattr(mod, "apply_rotary_pos_emb", None)
        if original is None:
            continue
        names = list(inspect.signature(original).parameters)
        rotated = names.index("cos") if "cos" in names else 2

        def identity(*args, _n=rotated, **kwargs):
            return args[0] if _n == 1 else tuple(args[:_n])

        saved[mod] = original
        mod.apply_rotary_pos_emb = identity
    if not saved:  # rotary applied some other way would be applied twice: refuse rather than rotate twice
        raise NotGroupQueryAttention("its modeling code has no apply_rotary_pos_emb to hand the rotary to the op")
    try:
        yield
    finally:
        for mod, original in saved.items():
            mod.apply_rotary_pos_emb = original


def _attention_modules(model) -> dict[int, object]:
    """Each layer's attention module (``layer_idx``, ``head_dim``; ``*Attention`` by class name)."""
    return {m.layer_idx: m for m in model.modules()
            if hasattr(m, "layer_idx") and hasattr(m, "head_dim") and type(m).__name__.endswith("Attention")}


def rotary_tables(model, positions: int) -> dict[int, tuple]:
    """Per layer, the (cos, sin) tables GroupQueryAttention rotates with: (positions, rotary_dim / 2)."""
    import torch

    rotary = getattr(getattr(model, "model", model), "rotary_emb", None)
    if rotary is None:
        raise NotGroupQueryAttention("the model has no rotary embedding module (model.rotary_emb)")
    ids = torch.arange(positions, dtype=torch.int64)[None]
    probe = torch.zeros(1, dtype=torch.float32)
    tables, by_type = {}, {}
    per_type = "layer_type" in inspect.signature(rotary.forward).parameters  # Gemma 4: a rope per layer type
    for layer, module in _attention_modules(model).items():
        kind = getattr(module, "layer_type", None) if per_type else None
        if kind not in by_type:
            with torch.no_grad():
                cos, sin = rotary(probe, ids, kind) if kind is not None else rotary(probe, ids)
            cos, sin = cos[0].float(), sin[0].float()
            half = cos.shape[-1] // 2
            if not (torch.equal(cos[:, :half], cos[:, half:]) and torch.equal(sin[:, :half], sin[:, half:])):
                raise NotGroupQueryAttention("its rotary table is not two equal halves (interleaved rotary)")
            by_type[kind] = (cos[:, :half].contiguous(), sin[:, :half].contiguous())
        tables[layer] = by_type[kind]
    return tables


def check_supported(config) -> None:
    """Refuse what GroupQueryAttention layers cannot hold: fixed-size states, shared key/values."""
    text = config.get_text_config(decoder=True)
    kinds = set(getattr(text, "layer_types", None) or ())
    if kinds - {"full_attention", "sliding_attention"}:
        raise NotGroupQueryAttention(f"layers of kind {sorted(kinds - {'full_attention', 'sliding_attention'})} "
                                     "keep state that is not a key/value cache")
    if kv_shared_layers(text.to_dict()):
        raise NotGroupQueryAttention("layers reuse another layer's key/value (num_kv_shared_layers)")


def _wrapper(model, tables: dict[int, tuple], layers: int):
    import torch

    class _GQADecoder(torch.nn.Module):
        """(input_ids, attention_mask, *past) -> (logits, *present), positions from the mask."""

        def __init__(self):
            super().__init__()
            self.model = model
            for layer, (cos, sin) in tables.items():  # buffers: initializers in the graph
                self.register_buffer(f"cos_{layer}", cos, persistent=False)
                self.register_buffer(f"sin_{layer}", sin, persistent=False)

        def forward(self, input_ids, attention_mask, *past):
            new = input_ids.shape[1]
            lengths = attention_mask.sum(-1)
            positions = lengths[:, None] - new + torch.arange(new, dtype=torch.int64)[None]
            _STEP.update(op=_register_op(), past=past, seqlens_k=(lengths - 1).to(torch.int32),
                         total=torch.ones_like(attention_mask[0]).sum().to(torch.int32), presents={},
                         tables={i: (getattr(self, f"cos_{i}"), getattr(self, f"sin_{i}")) for i in range(layers)})
            out = self.model(input_ids=input_ids, position_ids=positions, use_cache=False)
            presents = [t for i in range(layers) for t in _STEP["presents"][i]]
            return (out.logits, *presents)

    return _GQADecoder().eval()


def _sample(model, shapes: list[tuple[int, ...]]):
    """Inputs for tracing: batch 2, 3 new tokens after a past of 4 (torch.export specialises 0 and 1)."""
    import torch

    config = model.config.get_text_config(decoder=True)
    ids = torch.randint(0, max(config.vocab_size, 2), (SAMPLE_BATCH, SAMPLE_NEW), dtype=torch.int64)
    mask = torch.ones((SAMPLE_BATCH, SAMPLE_PAST + SAMPLE_NEW), dtype=torch.int64)
    past = [torch.randn(SAMPLE_BATCH, shape[0], SAMPLE_PAST, shape[2]) * 0.1 for shape in shapes]
    return ids, mask, past


def export_gqa_decoder(src: Path, dst: Path, opset: int, trust_remote_code: bool = False) -> None:
    """Write ``dst/model.onnx`` with GroupQueryAttention layers; NotGroupQueryAttention if it cannot."""
    import torch
    from torch.export import Dim
    from transformers import AttentionInterface, AutoConfig, AutoModelForCausalLM

    from xformopt.passes.export.decoder_dynamo import _finish, cache_slots

    config = AutoConfig.from_pretrained(src, trust_remote_code=trust_remote_code)
    check_supported(config)
    AttentionInterface.register(ATTENTION_NAME, _attention)
    model = load_quietly(AutoModelForCausalLM.from_pretrained, src, trust_remote_code=trust_remote_code,
                         dtype=torch.float32, attn_implementation="eager").eval()
    slots, shapes = cache_slots(model)  # each layer's cache shape, from one eager cached forward
    model.set_attn_implementation(ATTENTION_NAME)
    layers = len(slots)
    modules = _attention_modules(model)
    if sorted(modules) != list(range(layers)):
        raise NotGroupQueryAttention("its attention modules are not one *Attention module per layer")
    if any(hasattr(m, "sinks") for m in modules.values()):  # GPT-OSS: extra softmax logits the op does not take
        raise NotGroupQueryAttention("its attention has sink logits")
    tables = rotary_tables(model, int(model.config.get_text_config(decoder=True).max_position_embeddings))
    ids, mask, past = _sample(model, shapes)
    dyn = Dim.DYNAMIC
    axes = ({0: dyn, 1: dyn}, {0: dyn, 1: dyn}, tuple({0: dyn, 2: dyn} for _ in past))
    past_names = [f"past_key_values.{i}.{k}" for i in range(layers) for k in ("key", "value")]
    present_names = [f"present.{i}.{k}" for i in range(layers) for k in ("key", "value")]
    op = _register_op()
    with warnings.catch_warnings(), torch.no_grad(), contextlib.redirect_stdout(io.StringIO()), _rotary_off(model):
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            _wrapper(model, tables, layers), (ids, mask, *past), dynamic_shapes=axes, opset_version=opset,
            input_names=["input_ids", "attention_mask", *past_names], output_names=["logits", *present_names],
            custom_translation_table={op: _translation()}, dynamo=True, optimize=True, external_data=True)
    _finish(program, dst / "model.onnx")
