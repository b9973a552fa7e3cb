"""Decoders through torch's dynamo exporter: the families the genai builder does not build (Ministral 3 and
Gemma 4 text with GroupQueryAttention written at export, xformopt/passes/export/decoder_gqa.py; Qwen3.5 text
with its linear-attention states through xformopt/passes/export/decoder_dynamo.py), a causal LM the family
table has no row for (Granite),
and what is refused before any work (image/audio input, custom code without --trust-remote-code, a cache
that is not one key/value pair per layer).

Models are tiny random configs built in code (tests/tiny_decoders.py). Each family goes export -> fuse ->
int4 with its fused ops counted against its family row; greedy generation is compared token for token
with transformers' ``generate`` over 32 tokens.
"""

from __future__ import annotations

import json

import pytest
import tiny_decoders
from helpers import error_lines, make_ctx, run_cli, run_pass

NEW_TOKENS = 32
LAYERS = tiny_decoders.SHAPE["num_hidden_layers"]
DYNAMO_FAMILIES = ("ministral3", "gemma4_text", "qwen3_5_text")
# Ministral 3 and Gemma 4 export GroupQueryAttention (decoder_gqa); Qwen3.5's one full-attention layer fuses in `fuse`
ATTENTION_FUSES = {"ministral3": True, "gemma4_text": True, "qwen3_5_text": True}
GQA_EXPORTED = ("ministral3", "gemma4_text")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("dynamo-decoders")
    return {f: tiny_decoders.build(root / f, f, seed=i) for i, f in enumerate((*DYNAMO_FAMILIES, "granite", "llama"))}


# The last step per family. Gemma 4 goes to dynamic INT8: on random tiny weights its 4-bit logits fall to
# cosine 0.88 to float (the int4 pass's floor is 0.9), with any block size or 8-bit lm_head; INT8 keeps 0.997.
LAST_STEP = {"ministral3": "int4", "gemma4_text": "quantize", "qwen3_5_text": "int4", "granite": "int4"}


@pytest.fixture(scope="module")
def stages(tmp_path_factory, models, sample_texts):
    """{family: {"export" | "fuse" | "int4" | "quantize": (dir, record)}} for the dynamo families and the generic one."""
    root = tmp_path_factory.mktemp("dynamo-stages")
    out = {}
    for family, last in LAST_STEP.items():
        model, ctx = models[family], make_ctx(models[family], sample_texts)
        e, f, q = (root / f"{family}-{s}" for s in ("e", "f", "q"))
        out[family] = {"export": (e, run_pass("export", ctx, model, e))}
        out[family]["fuse"] = (f, run_pass("fuse", make_ctx(model, sample_texts), e, f, select="all"))
        budget = {"max_perplexity_increase": "3%"} if last == "int4" else {}  # the int4 recipe's budget loop
        out[family][last] = (q, run_pass(last, make_ctx(model, sample_texts), f, q, **budget))
    return out


def _greedy_reference(model_dir, prompt: list[int]) -> list[int]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    return model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None,
                          pad_token_id=0)[0, len(prompt):].tolist()


def _greedy_onnx(stage_dir, prompt: list[int]) -> list[int]:
    from xformopt.decoder.generate import generate
    from xformopt.runtime.decoder import OrtDecoder

    return generate(OrtDecoder(stage_dir, threads=2), prompt, NEW_TOKENS).new_ids


def _prompt(model_dir) -> list[int]:
    from xformopt.models import load_tokenizer

    return list(load_tokenizer(model_dir)("The movie was a")["input_ids"])


@pytest.mark.parametrize("family", DYNAMO_FAMILIES)
def test_family_exports_with_split_cache_parity(family, stages):
    record = stages[family]["export"][1]
    assert "dynamo" in record["exporter"] and record["cache_layout"] == "split"
    assert record["past_inputs"] == 2 * LAYERS and f"present.{LAYERS - 1}.value" in record["outputs"]
    parity = record["parity"]
    assert parity["max_abs_diff"] < 1e-4 and 0 in parity["past_lengths"] and max(parity["past_lengths"]) > 8
    assert parity["greedy_argmax_mismatches"] == 0
    if family in GQA_EXPORTED:  # the builder's layout: positions from the mask, rows unpadded (no left padding)
        assert "GroupQueryAttention" in record["exporter"] and "position_ids" not in record["inputs"]
        assert record["inputs"][:2] == ["input_ids", "attention_mask"] and "skipped" in parity["padded_batch"]
    else:
        assert record["inputs"][:3] == ["input_ids", "attention_mask", "position_ids"]
        assert parity["padded_batch"]["batch"] == 2


def test_qwen3_5_linear_attention_solves_are_exported_as_loops(stages, models):
    """Each Gated DeltaNet layer's two triangular solves are one ONNX Loop each (not transformers' unrolled
    forward substitution, 63 sliced steps per solve); the export's parity above covers the graph."""
    import onnx

    record = stages["qwen3_5_text"]["export"][1]
    assert "ONNX Loops" in record["exporter"] and record["parity"]["greedy_argmax_mismatches"] == 0
    graph = onnx.load(stages["qwen3_5_text"]["export"][0] / "model.onnx", load_external_data=False).graph
    linear = json.loads((models["qwen3_5_text"] / "config.json").read_text())["layer_types"].count("linear_attention")
    assert linear and sum(node.op_type == "Loop" for node in graph.node) == 2 * linear
    assert len(graph.node) < 600  # the unrolled form: 1,710 nodes for this model


def test_int4_harm_ranking_reads_a_text_longer_than_one_graph_call(stages, tmp_path):
    """Qwen3.5's graph takes at most 64 new tokens a call, with position_ids: the int4 budget's harm ranking cuts a
    longer held-out text to one call, its positions with it (they once kept the whole text's length)."""
    import onnx

    from xformopt.passes.int4.harm import harm_scores
    from xformopt.passes.int4.run import Int4Options, weighted_matmuls

    fused = stages["qwen3_5_text"]["fuse"][0] / "model.onnx"
    names = weighted_matmuls(onnx.load(fused, load_external_data=False))[:4]
    scores = harm_scores(fused, names, [list(range(3, 103)), list(range(3, 23))], Int4Options(), tmp_path)
    assert sorted(scores) == sorted(names) and all(0 < v < 1 for v in scores.values())


@pytest.mark.parametrize("family", DYNAMO_FAMILIES)
def test_family_fuses_what_its_row_expects_and_quantizes(family, stages):
    from xformopt.families import FAMILIES

    fused = stages[family]["fuse"][1]
    expected = {op: n * LAYERS for op, n in FAMILIES[family].fused_per_layer.items()}
    assert fused["expected"] == expected and expected
    assert all(fused["fused_kept"][op] >= n for op, n in expected.items())
    assert fused["fusion_route"].startswith("onnxscript")
    assert fused["decoder"]["attention_fused"] is ATTENTION_FUSES[family]
    if LAST_STEP[family] == "int4":
        int4 = stages[family]["int4"][1]
        packed = int4.get("fused_projections", {})  # same-input MatMuls packed as one (q/k/v, gate/up)
        packed_away = packed["matmuls_fused"] - packed["groups"] if packed.get("used") else 0
        assert int4["matmulnbits"]["4bit"] + packed_away >= 7 * LAYERS  # q, k, v, o, gate, up, down of every layer
        assert int4["budget"]["budget_met"]
    else:
        quantized = stages[family]["quantize"][1]
        assert quantized["coverage"]["int8"] == quantized["coverage"]["weighted_gemms"] > 0
    step, record = LAST_STEP[family], stages[family][LAST_STEP[family]][1]
    assert record["agreement"]["mean_agreement"] > 0.9, step


@pytest.mark.parametrize("family", DYNAMO_FAMILIES)
def test_family_greedy_32_tokens_match_transformers_generate(family, models, stages):
    prompt = _prompt(models[family])
    reference = _greedy_reference(models[family], prompt)
    for stage in ("export", "fuse"):
        assert _greedy_onnx(stages[family][stage][0], prompt) == reference, stage


def test_llama_greedy_32_tokens_match_transformers_generate(models, sample_texts, tmp_path):
    """The default route for Llama (the genai builder when installed, else the dynamo export)."""
    prompt = _prompt(models["llama"])
    run_pass("export", make_ctx(models["llama"], sample_texts), models["llama"], tmp_path / "e")
    assert _greedy_onnx(tmp_path / "e", prompt) == _greedy_reference(models["llama"], prompt)


def test_a_causal_lm_off_the_family_table_exports_through_the_generic_row(stages):
    from xformopt.families import FAMILIES, family_of

    assert "granite" not in FAMILIES and family_of("granite").generic and family_of("granite").decoder
    record, fused = stages["granite"]["export"][1], stages["granite"]["fuse"][1]
    assert "dynamo" in record["exporter"] and record["parity"]["max_abs_diff"] < 1e-4
    assert fused["expected"] == {}  # nothing required: the record says what fired
    assert fused["fused_kept"]["SkipSimplifiedLayerNormalization"] == 2 * LAYERS
    assert "attention_fused" in fused["decoder"]


def _edited(src, dst, **changes):
    import shutil

    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    config.update(changes)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


@pytest.mark.parametrize("changes, message", [
    ({"vision_config": {"hidden_size": 8}}, "vision_config"),
    ({"audio_config": {"hidden_size": 8}}, "audio_config"),
    ({"model_type": "my_decoder", "auto_map": {"AutoModelForCausalLM": "modeling_my.MyForCausalLM"}},
     "--trust-remote-code"),
    ({"layer_types": ["linear_attention", "full_attention"]}, "keep state beyond a key/value cache"),
])
def test_unsupported_decoders_are_refused_in_one_line_before_any_work(models, tmp_path, capsys, changes, message):
    model = _edited(models["granite"], tmp_path / "m", **changes)
    code, _, err = run_cli(["export", model, "-o", tmp_path / "o"], capsys)
    lines = error_lines(err)
    assert code == 2 and len(lines) == 1 and message in lines[0], err
    assert not (tmp_path / "o").exists()



def test_qwen3_5_states_carry_a_prompt_longer_than_one_chunk(models, stages):
    """Qwen3.5's graph takes at most 64 new tokens a call (the one Gated DeltaNet chunk the export traced):
    a 100-token prompt is fed in two pieces, the conv/recurrent states carried between them, and every
    step after it matches PyTorch, alone and in a left-padded batch."""
    from xformopt.passes.export.decoder import check_decoder_parity
    from xformopt.runtime.decoder import OrtDecoder, TorchDecoder

    runner = OrtDecoder(stages["qwen3_5_text"]["fuse"][0], threads=2)
    assert runner.step_limit == 64 and {n.split(".")[-1] for n in runner.layout.past_names} == {
        "conv", "recurrent", "key", "value"}
    prompts = [list(range(5, 105)), list(range(200, 270))]
    parity = check_decoder_parity(TorchDecoder(models["qwen3_5_text"], threads=2), runner, prompts, steps=3)
    assert parity["max_abs_diff"] < 1e-4 and parity["greedy_argmax_mismatches"] == 0
    assert parity["padded_batch"]["lengths"] == [100, 70]
