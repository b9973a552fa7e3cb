"""Export a ``*ForConditionalGeneration`` checkpoint as an encoder graph and a cached decoder graph
with ``torch.onnx.export(dynamo=True)`` (see :mod:`xformopt.seq2seq` for the two graphs).

The wrappers build transformers' own ``EncoderDecoderCache`` from flat tensors, so the model's code
(T5's relative position buckets, BART's learned positions, Marian's sinusoidal ones) runs unchanged
with the cache offset. Dummy inputs use batch 2 and lengths >= 3: torch.export specialises a
dimension it sees as 0 or 1.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from pathlib import Path

from xformopt.models.cache_names import cache_kwargs, output_cache
from xformopt.seq2seq import DECODER_FILE, ENCODER_FILE
from xformopt.seq2seq.runner import decoder_start_token


def present_names(layers: int, prefix: str = "present", cross: bool = True) -> list[str]:
    kinds = ("decoder", "encoder") if cross else ("decoder",)
    return [f"{prefix}.{i}.{kind}.{part}" for i in range(layers) for kind in kinds for part in ("key", "value")]


def _wrappers(model, width: int):
    """The two export modules; ``width``: the encoder states' width (read off an eager run: config names
    differ by family, and T5Gemma nests its halves' configs)."""
    import torch
    from transformers import DynamicCache, EncoderDecoderCache
    from transformers.modeling_outputs import BaseModelOutput

    start = decoder_start_token(model)

    def flat(cache, cross: bool) -> list:
        out = []
        for layer, xlayer in zip(cache.self_attention_cache.layers, cache.cross_attention_cache.layers):
            out += [layer.keys, layer.values] + ([xlayer.keys, xlayer.values] if cross else [])
        return out

    class EncoderStep(torch.nn.Module):
        """Encoder, cross-attention cache and the first decoder step (the start token)."""

        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            states = self.model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            first = torch.full((input_ids.shape[0], 1), start, dtype=torch.long, device=input_ids.device)
            cache = EncoderDecoderCache(DynamicCache(config=self.model.config), DynamicCache(config=self.model.config))
            out = self.model(encoder_outputs=BaseModelOutput(last_hidden_state=states), attention_mask=attention_mask,
                             decoder_input_ids=first, **cache_kwargs(self.model, cache), use_cache=True, return_dict=True)
            return (states, out.logits, *flat(output_cache(out), cross=True))

    class DecoderStep(torch.nn.Module):
        """One cached step: new token(s) after the self-attention past, against the cross-attention cache."""

        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, decoder_input_ids, encoder_attention_mask, *past):
            self_data = [(past[4 * i], past[4 * i + 1]) for i in range(len(past) // 4)]
            cross_data = [(past[4 * i + 2], past[4 * i + 3]) for i in range(len(past) // 4)]
            cache = EncoderDecoderCache(DynamicCache(self_data), DynamicCache(cross_data))
            # the encoder states are not read once the cross cache is filled; only their shape and dtype
            batch, source = encoder_attention_mask.shape
            states = torch.zeros(batch, source, width, dtype=past[0].dtype)
            out = self.model(encoder_outputs=BaseModelOutput(last_hidden_state=states),
                             attention_mask=encoder_attention_mask, decoder_input_ids=decoder_input_ids,
                             **cache_kwargs(self.model, cache), use_cache=True, return_dict=True)
            return (out.logits, *flat(output_cache(out), cross=False))

    return EncoderStep(), DecoderStep(), start


def export_seq2seq(model, out_dir: Path, opset: int) -> dict:
    """Write ``encoder.onnx`` and ``decoder.onnx`` for ``model`` (eval mode) into ``out_dir``; returns
    the graphs' input and output names."""
    import torch

    batch, source, past = 2, 5, 3
    ids = torch.full((batch, source), 3, dtype=torch.long)  # unk ids: any token does for tracing
    mask = torch.ones(batch, source, dtype=torch.long)
    mask[1, -1] = 0  # a padded row: the mask's values must reach the graph, not be folded
    with torch.no_grad():  # the cache's shape (layers, KV heads, head widths) as this model builds it
        width = model.get_encoder()(input_ids=ids, attention_mask=mask).last_hidden_state.shape[-1]
    encoder, decoder, _ = _wrappers(model, width)
    with torch.no_grad():
        first = encoder(ids, mask)
    cross = first[2:]
    layers = len(cross) // 4
    b, s, p = torch.export.Dim("batch", min=1), torch.export.Dim("source", min=1), torch.export.Dim("past", min=1)
    step = torch.export.Dim("step", min=1)
    present = present_names(layers)
    enc_outputs = ["last_hidden_state", "logits", *present]
    _export(encoder, (ids, mask), ["input_ids", "attention_mask"], enc_outputs,
            ({0: b, 1: s}, {0: b, 1: s}), out_dir / ENCODER_FILE, opset)

    pasts = []
    for i in range(layers):  # each layer's self-attention past as the first step made it, longer
        k_self = torch.randn(batch, cross[4 * i].shape[1], past, cross[4 * i].shape[-1])
        v_self = torch.randn(batch, cross[4 * i + 1].shape[1], past, cross[4 * i + 1].shape[-1])
        pasts += [k_self, v_self, cross[4 * i + 2], cross[4 * i + 3]]
    past_names = present_names(layers, "past")
    axes = [{0: b, 2: p} if ".decoder." in n else {0: b, 2: s} for n in past_names]
    dec_inputs = ["decoder_input_ids", "encoder_attention_mask", *past_names]
    dec_outputs = ["logits", *present_names(layers, cross=False)]
    new = torch.full((batch, 2), 3, dtype=torch.long)  # two new tokens: a length of 1 would be specialised
    _export(decoder, (new, mask, *pasts), dec_inputs, dec_outputs, ({0: b, 1: step}, {0: b, 1: s}, tuple(axes)),
            out_dir / DECODER_FILE, opset)
    return {"encoder": {"inputs": ["input_ids", "attention_mask"], "outputs": enc_outputs},
            "decoder": {"inputs": dec_inputs, "outputs": dec_outputs}, "layers": layers}


def _export(module, args, input_names, output_names, dynamic_shapes, path: Path, opset: int) -> None:
    import torch

    # the exporter prints its progress on stdout: kept off ours (the CLI may write JSON there)
    with warnings.catch_warnings(), torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        program = torch.onnx.export(module, args, input_names=input_names, output_names=output_names,
                                    dynamic_shapes=dynamic_shapes, opset_version=opset, dynamo=True, verbose=False)
    program.save(str(path))
