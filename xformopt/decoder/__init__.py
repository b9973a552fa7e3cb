"""Decoder (text-generation) support: a generation loop, perplexity, the bytes a step reads, and a
generation benchmark (the export with a KV cache is the export pass's: xformopt/passes/export/decoder.py).

One ONNX graph serves every step. Step 0 (the prompt) feeds the whole prompt with a *zero-length*
past (shape ``(..., 0, head_dim)``); every later step feeds one token and the previous step's
``present`` tensors as ``past``. Two cache layouts exist, detected from the graph's input names:

- ``stacked`` (GPT-2): ``past_{i}`` / ``present_{i}`` of shape ``(2, batch, heads, length, head_dim)``,
  keys and values stacked: the layout ONNX Runtime's GPT-2 ``Attention`` fusion matches (it turns
  each layer into one ``com.microsoft.Attention`` node with a ``past`` input and a ``present`` output);
- ``split`` (the genai builder's and the dynamo export's, as optimum wrote it): ``past_key_values.{i}.key`` /
  ``.value`` and ``present.{i}.key`` / ``.value`` of shape ``(batch, kv_heads, length, head_dim)``; a
  linear-attention layer (Qwen3.5) has fixed-size ``.conv`` / ``.recurrent`` states instead.

Modules: :mod:`xformopt.runtime.decoder` (ONNX Runtime and PyTorch step runners, IO binding), :mod:`.generate`
(greedy and sampled generation, prompt checks), :mod:`.perplexity`, :mod:`.traffic` (bytes per step),
:mod:`.bench` (time to first token, per-token latency, tokens/s).
"""
