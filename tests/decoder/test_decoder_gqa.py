"""GroupQueryAttention from the dynamo decoder export (xformopt/passes/export/decoder_gqa.py): a Llama-like
causal LM off the family table (Granite, the generic row), Llama forced off the genai builder, Ministral 3
(position-dependent query scale) and Gemma 4 text (sliding + full layers of two head sizes).

Each is exported and fused, and must have one GroupQueryAttention per layer, decode 32 greedy tokens
equal to transformers' ``generate`` (export and fuse), and decode two prompts of different lengths
together in :class:`~xformopt.runtime.batch_decoder.BatchDecoder` (serve's continuous batching) exactly as
each decodes alone; one family is asked through a real ``serve`` on a free port. Qwen3.5 (linear-attention
states) is refused by the batch engine in one line while its single-stream runner still decodes (serve batches
it in left-padded rows: tests/serve/test_serve_unbatched.py).
Tiny random configs built in code (tests/tiny_decoders.py); no timing is asserted.
"""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest
import tiny_decoders
from helpers import make_ctx, run_pass
from serve_helpers import ServerThread
from test_decoder_families import NEW_TOKENS, _greedy_onnx, _greedy_reference, _prompt

LAYERS = tiny_decoders.SHAPE["num_hidden_layers"]
FAMILIES = ("granite", "llama", "ministral3", "gemma4_text")
# Ministral 3's query scale, 1 + beta * log(1 + floor(position / original_max_position_embeddings)), is 1 below
# that length (16384 by default): shortened here so it changes every 16 positions of the tests' sequences.
SCALE_EVERY = 16


def _build(directory, family: str, seed: int):
    if family != "ministral3":
        return tiny_decoders.build(directory, family, seed=seed)
    from toy_decoder import build_decoder

    base = tiny_decoders.make_config(family)

    def config(vocab_size, eos_id):
        made = base(vocab_size, eos_id)
        made.rope_parameters = {**made.rope_parameters, "original_max_position_embeddings": SCALE_EVERY,
                                "llama_4_scaling_beta": 0.5}
        return made

    return build_decoder(directory, family, make_config=config, context=tiny_decoders.CONTEXT, seed=seed,
                         train_steps=0, train_batch=8)


@pytest.fixture(scope="module")
def stages(tmp_path_factory, sample_texts, request):
    """{family: (model dir, export (dir, record), fuse (dir, record))}; Llama with the genai builder hidden."""
    from xformopt import families

    root = tmp_path_factory.mktemp("gqa-decoders")
    out = {}
    patch = pytest.MonkeyPatch()
    request.addfinalizer(patch.undo)
    for seed, family in enumerate(FAMILIES):
        model = _build(root / family, family, seed=10 + seed)
        with patch.context() as p:
            if family == "llama":  # the route a builder family takes without the genai extra
                p.setattr(families, "genai_builder_available", lambda: False)
            e, f = root / f"{family}-e", root / f"{family}-f"
            exported = run_pass("export", make_ctx(model, sample_texts), model, e)
        fused = run_pass("fuse", make_ctx(model, sample_texts), e, f, select="all")
        out[family] = (model, (e, exported), (f, fused))
    return out


def _gqa_nodes(stage_dir) -> int:
    import onnx

    graph = onnx.load(stage_dir / "model.onnx", load_external_data=False).graph
    return sum(n.op_type == "GroupQueryAttention" for n in graph.node)


@pytest.mark.parametrize("family", FAMILIES)
def test_export_writes_group_query_attention_per_layer_and_fuse_keeps_it(family, stages):
    _, (e, exported), (f, fused) = stages[family]
    assert "GroupQueryAttention" in exported["exporter"] and "decoder_gqa" in exported["exporter"]
    assert exported["inputs"][:2] == ["input_ids", "attention_mask"] and "position_ids" not in exported["inputs"]
    assert exported["parity"]["max_abs_diff"] < 1e-4 and exported["parity"]["greedy_argmax_mismatches"] == 0
    assert _gqa_nodes(e) == LAYERS and _gqa_nodes(f) == LAYERS
    assert fused["fused_kept"]["GroupQueryAttention"] == LAYERS
    assert fused["decoder"]["attention_fused"] is True


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_32_tokens_match_transformers_generate(family, stages):
    model, (e, _), (f, _) = stages[family]
    prompt = _prompt(model)
    reference = _greedy_reference(model, prompt)
    assert len(reference) == NEW_TOKENS and len(prompt) + NEW_TOKENS > 2 * SCALE_EVERY  # Ministral 3's scale varies
    for stage in (e, f):
        assert _greedy_onnx(stage, prompt) == reference, stage.name


def _batched(engine, prompts: list[list[int]], new: int) -> list[list[int]]:
    """Greedy decoding of every prompt at once: each prefilled on its row, then decoded together."""
    slots, got = [], []
    for prompt in prompts:
        slot = engine.open(len(prompt) + new)
        got.append([int(np.argmax(engine.prefill(slot, prompt)))])
        engine.start_decoding(slot)
        slots.append(slot)
    for _ in range(new - 1):
        rows = engine.decode([tokens[-1] for tokens in got])
        for tokens, row in zip(got, rows):
            tokens.append(int(np.argmax(row)))
    return got


@pytest.mark.parametrize("family", FAMILIES)
def test_batch_decoder_decodes_two_lengths_together_as_each_alone(family, stages):
    from xformopt.runtime.batch_decoder import BatchDecoder

    model, _, (f, _) = stages[family]
    short = _prompt(model)
    long = list(range(3, 40))  # longer than Gemma 4's sliding window (8) and than the short prompt
    engine = BatchDecoder(f, threads=2, max_kv_tokens=1024, max_rows=4)
    alone = [_greedy_onnx(f, p) for p in (short, long)]
    assert _batched(engine, [short, long], NEW_TOKENS) == alone
    assert engine.calls["decode"] == NEW_TOKENS - 1  # one call per step for both rows


def test_serve_answers_two_concurrent_prompts_as_single_stream(stages):
    from xformopt.decoder.generator import TextGenerator
    from xformopt.serve.app import ServeConfig, create_app
    from xformopt.serve.decoder_scheduler import DecoderSettings

    _, _, (f, _) = stages["ministral3"]
    prompts = ["The movie was a", "A long and winding story about a film that nobody had ever seen before"]
    config = ServeConfig(str(f), threads=1, model_name="tiny", decoder=DecoderSettings(max_streams=4, max_kv_tokens=2048))

    async def ask(url):
        async with httpx.AsyncClient(timeout=120) as client:
            replies = await asyncio.gather(*(client.post(f"{url}/v1/completions", json={
                "prompt": p, "max_tokens": 16, "temperature": 0}) for p in prompts))
        assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
        return [r.json()["choices"][0]["text"] for r in replies]

    with ServerThread(create_app(config)) as server:
        answers = asyncio.run(ask(server.url))
    generator = TextGenerator(f, threads=1)
    assert answers == [generator.generate(p, max_new_tokens=16).text for p in prompts]


def test_qwen3_5_is_refused_by_continuous_batching_in_one_line_and_decodes_alone(tmp_path, sample_texts):
    from transformers import AutoConfig

    from xformopt.errors import InputError
    from xformopt.passes.export.decoder_gqa import NotGroupQueryAttention, check_supported
    from xformopt.runtime.batch_decoder import BatchDecoder, unbatchable_reason

    model = tiny_decoders.build(tmp_path / "m", "qwen3_5_text", seed=3)
    record = run_pass("export", make_ctx(model, sample_texts), model, tmp_path / "e")
    assert "decoder_dynamo" in record["exporter"]  # its row's route: the plain dynamo export, states carried
    with pytest.raises(NotGroupQueryAttention, match="linear_attention"):  # what the GQA export says of it
        check_supported(AutoConfig.from_pretrained(model))
    with pytest.raises(InputError) as refused:
        BatchDecoder(tmp_path / "e", threads=2)
    message = str(refused.value)
    assert "\n" not in message and "linear-attention states" in message and ".conv" in message
    assert "linear-attention states" in unbatchable_reason(tmp_path / "e")  # serve pads its rows instead
    prompt = _prompt(model)
    assert _greedy_onnx(tmp_path / "e", prompt) == _greedy_reference(model, prompt)


def test_gqa_export_that_misses_parity_falls_back_to_the_plain_dynamo_export(stages, sample_texts, tmp_path,
                                                                             monkeypatch, caplog):
    """A model type whose attention the GQA export does not anticipate (here: its graph's logits made wrong
    after export) takes the plain dynamo export, loudly, instead of failing the run."""
    import onnx
    from onnx import numpy_helper

    from xformopt.passes.export import decoder

    real = decoder.export_gqa_or_dynamo

    def wrong_logits(src, dst, opset, trust_remote_code=False):
        how = real(src, dst, opset, trust_remote_code)
        model = onnx.load(dst / "model.onnx")
        biggest = max(model.graph.initializer, key=lambda t: int(np.prod(t.dims)))  # the embedding / head table
        biggest.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(biggest) * 1.5, biggest.name))
        onnx.save(model, dst / "model.onnx")
        return how

    monkeypatch.setattr(decoder, "GQA_EXPORTER", (decoder.GQA_EXPORTER_NAME, wrong_logits))
    model = stages["granite"][0]
    with caplog.at_level("WARNING"):
        record = run_pass("export", make_ctx(model, sample_texts), model, tmp_path / "e")
    assert record["exporter"] == decoder.DYNAMO_EXPORTER[0]
    assert _gqa_nodes(tmp_path / "e") == 0
    assert record["parity"]["max_abs_diff"] < 1e-3
    assert any("missed parity" in r.getMessage() and "plain dynamo" in r.getMessage() for r in caplog.records)
