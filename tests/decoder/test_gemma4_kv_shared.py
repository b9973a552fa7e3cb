"""Gemma 4 with layers that reuse another layer's key/value (``num_kv_shared_layers``), built in code:
4 layers (sliding, full, sliding, full), the last two reading the first two's key/value inside the step.

The GroupQueryAttention export refuses it and the plain dynamo export carries a past only for the two
layers that keep one; parity holds at every step of a greedy decode. ``fuse`` holds it to its other
fusions (onnxscript's attention rules do not match a key/value feeding two layers' attention) and says
what fired. ``serve``'s left-padded engine batches it: joined sequences decode as each would alone.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tiny_decoders
from helpers import make_ctx, run_pass

SHARED = 2


def _config(vocab_size: int, eos_id: int):
    import transformers

    shape = {**tiny_decoders.SHAPE, "num_hidden_layers": 4}
    return transformers.Gemma4TextConfig(
        vocab_size=vocab_size, bos_token_id=eos_id, eos_token_id=eos_id, **shape, head_dim=16, global_head_dim=32,
        layer_types=["sliding_attention", "full_attention"] * 2, sliding_window=8, hidden_size_per_layer_input=16,
        pad_token_id=0, vocab_size_per_layer_input=vocab_size, num_kv_shared_layers=SHARED)


@pytest.fixture(scope="module")
def shared(tmp_path_factory, sample_texts) -> tuple[Path, dict, object]:
    from toy_decoder import build_decoder

    root = tmp_path_factory.mktemp("gemma4-kv-shared")
    model = build_decoder(root / "m", "gemma4_text", make_config=_config, context=tiny_decoders.CONTEXT, seed=1)
    ctx = make_ctx(model, sample_texts)
    record = run_pass("export", ctx, model, root / "e")
    return root / "e", record, ctx


def test_the_plain_dynamo_export_carries_only_the_layers_that_keep_a_past(shared):
    exported, record, ctx = shared
    assert "decoder_dynamo" in record["exporter"]
    assert any("GroupQueryAttention export refused" in line and "num_kv_shared_layers" in line for line in ctx.messages)
    assert record["past_inputs"] == 2 * SHARED
    assert [name for name in record["inputs"] if name.startswith("past_key_values")] == [
        f"past_key_values.{i}.{kind}" for i in range(SHARED) for kind in ("key", "value")]
    parity = record["parity"]
    assert parity["greedy_argmax_mismatches"] == 0 and parity["compared_steps"] > 0
    assert parity["max_abs_diff"] < 1e-4


def test_fuse_holds_it_to_the_fusions_that_can_fire(shared, tmp_path):
    exported, _, ctx = shared
    record = run_pass("fuse", ctx, exported, tmp_path / "f")
    assert record["expected"] == {"FastGelu": 2 * 4}  # no attention op: see the module docstring
    assert record["fused_possible"]["FastGelu"] == 8
    assert record["decoder"]["attention_fused"] is False


def test_left_padded_batch_decodes_as_each_sequence_alone(shared):
    from xformopt.decoder.generate import generate
    from xformopt.runtime.decoder import OrtDecoder
    from xformopt.runtime.padded_batch_decoder import PaddedBatchDecoder

    exported = shared[0]
    prompts = {"a": [5, 17, 33, 9, 41, 8, 3, 12, 30, 2, 7], "b": [11, 12, 13]}  # "a" is past the window of 8
    new = 12
    alone = {k: generate(OrtDecoder(exported, threads=1), p, new, eos_token_id=None).new_ids for k, p in prompts.items()}
    engine = PaddedBatchDecoder(exported, threads=1, max_kv_tokens=1024, max_rows=2)
    got, slots = {}, {}
    for key, prompt in prompts.items():
        slots[key] = engine.open(len(prompt) + new)
        logits = engine.prefill(slots[key], prompt)
        engine.start_decoding(slots[key])
        got[key] = [int(np.argmax(logits))]
    while any(len(ids) < new for ids in got.values()):
        order = [next(k for k in slots if slots[k] is s) for s in engine.decoding]
        for key, row in zip(order, engine.decode([got[k][-1] for k in order])):
            got[key].append(int(np.argmax(row)))
    assert got == alone
