"""Encoder-decoder models (T5, BART, mBART, Marian): export, ONNX Runtime runner, generation.

An artifact holds two graphs:

- ``encoder.onnx``: the encoder, the cross-attention cache (computed once per input) and the first
  decoder step (the model's decoder start token): ``input_ids``, ``attention_mask`` ->
  ``last_hidden_state``, ``logits`` and ``present.{i}.decoder|encoder.key|value``;
- ``decoder.onnx``: one cached step: ``decoder_input_ids``, ``encoder_attention_mask``,
  ``past.{i}.decoder.*`` (self-attention, growing by one per step) and ``past.{i}.encoder.*``
  (cross-attention, fixed) -> ``logits`` and ``present.{i}.decoder.*``.

Folding the first step into the encoder graph (as ONNX Runtime's own T5 beam search does with its
"encoder_decoder_init" graph) means the decoder graph never sees an empty past, which torch.export
would specialise on.
"""

from xformopt.onnx_graph import SEQ2SEQ_GRAPHS

ENCODER_FILE, DECODER_FILE = SEQ2SEQ_GRAPHS
GRAPH_FILES = SEQ2SEQ_GRAPHS
