"""Decoder (text-generation) support: export with a KV cache, a generation loop, perplexity, and a
generation benchmark.

One ONNX graph serves every step. Step 0 (the prompt) feeds the whole prompt with a *zero-length*
past (shape ``(..., 0, head_dim)``); every later step feeds one token and the previous step's
``present`` tensors as ``past``. Two cache layouts exist, detected from the graph's input names:

- ``stacked`` (GPT-2): ``past_{i}`` / ``present_{i}`` of shape ``(2, batch, heads, length, head_dim)``,
  keys and values stacked: the layout ONNX Runtime's GPT-2 ``Attention`` fusion matches (it turns
  each layer into one ``com.microsoft.Attention`` node with a ``past`` input and a ``present`` output);
- ``split`` (Llama and other optimum exports): ``past_key_values.{i}.key`` / ``.value`` and
  ``present.{i}.key`` / ``.value`` of shape ``(batch, kv_heads, length, head_dim)``.

Modules: :mod:`.runtime` (ONNX Runtime and PyTorch step runners, IO binding), :mod:`.generate`
(greedy and sampled generation, prompt checks), :mod:`.export` (export with past, multi-step parity),
:mod:`.perplexity`, :mod:`.bench` (time to first token, per-token latency, tokens/s).
"""

# Passes that handle decoders; the others (prune, distill) are BERT-family only for now.
DECODER_PASSES = ("export", "fuse", "quantize")


def check_passes(steps, spec) -> None:
    """Fail before any work when a step (pass name, options) of the chain cannot take a decoder."""
    from xformopt.errors import InputError
    from xformopt.models import SUPPORTED_MODEL_TYPES

    if not spec.is_decoder:
        if any(name == "quantize" and (options or {}).get("mode") == "int4" for name, options in steps):
            raise InputError(f"quantize --mode int4 is for decoders (text-generation); {spec.model_type!r} is an encoder: "
                             "use --mode dynamic or static")
        return
    for name, options in steps:
        if name not in DECODER_PASSES:
            raise InputError(
                f"unsupported architecture {spec.model_type!r} for pass {name!r}: it takes encoders "
                f"({', '.join(SUPPORTED_MODEL_TYPES)}); decoders (text-generation) support {', '.join(DECODER_PASSES)}"
            )
        options = options or {}
        if name == "quantize" and (options.get("mode") == "static" or options.get("max_accuracy_drop") is not None):
            raise InputError("decoders (text-generation) support dynamic INT8 only: static calibration and the accuracy "
                             "budget feed encoder inputs; use --mode dynamic without --max-accuracy-drop")
