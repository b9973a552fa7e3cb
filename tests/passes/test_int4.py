"""Grouped-query decoders (Qwen2, Llama, Mistral, Phi-3, Qwen3) with fused attention and 4-bit
weight-only quantization (MatMulNBits).

Models are tiny and built in code (tests/tiny_decoders.py): 2 layers, 4 query heads sharing 2 KV
heads. The Qwen2 is trained for a few seconds on the vendored text so that perplexity means
something; the others are random. Nothing here times anything (benchmarks/int4.py does).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import tiny_decoders
from helpers import make_ctx, run_cli, run_pass
from pydantic import ValidationError

from xformopt import recipe
from xformopt.errors import InputError

pytestmark = pytest.mark.extra("genai")

INT4_PPL_TOLERANCE = 0.05  # the bar; measured +0.1% on the trained tiny Qwen2 (RTN, block 32)
LAYERS = tiny_decoders.SHAPE["num_hidden_layers"]


@pytest.fixture(scope="session")
def family_models(tmp_path_factory):
    """{family: model dir}; qwen2 trained briefly, the others random."""
    root = tmp_path_factory.mktemp("gqa-models")
    return {f: tiny_decoders.build(root / f, f, train_steps=60 if f == "qwen2" else 0, seed=i)
            for i, f in enumerate(tiny_decoders.FAMILIES)}


@pytest.fixture(scope="session")
def family_stages(tmp_path_factory, family_models, sample_texts):
    """{family: {"export": (dir, record), "int4": (dir, record)}} (int4: RTN, the recipe's defaults)."""
    root = tmp_path_factory.mktemp("gqa-stages")
    stages = {}
    for family, model in family_models.items():
        ctx = make_ctx(model, sample_texts)
        e, q = root / f"{family}-e", root / f"{family}-q"
        stages[family] = {"export": (e, run_pass("export", ctx, model, e)),
                          "int4": (q, run_pass("int4", ctx, e, q))}
    return stages


def _torch(model_dir):
    from xformopt.runtime.decoder import TorchDecoder

    return TorchDecoder(model_dir, threads=2)


def _onnx(stage_dir):
    from xformopt.runtime.decoder import OrtDecoder

    return OrtDecoder(stage_dir, threads=2)


@pytest.mark.parametrize("family", tiny_decoders.FAMILIES)
def test_gqa_family_exports_fused_attention_with_parity_at_every_step(family, family_models, family_stages):
    config = json.loads((family_models[family] / "config.json").read_text())
    assert config["num_key_value_heads"] < config["num_attention_heads"]  # grouped-query attention
    directory, record = family_stages[family]["export"]
    assert record["fused"]["GroupQueryAttention"] == LAYERS and record["decoder"]["attention_fused"] is True
    assert record["fused"]["SkipSimplifiedLayerNormalization"] == 2 * LAYERS
    assert record["cache_layout"] == "split" and "genai" in record["exporter"]
    parity = record["parity"]
    assert 0 in parity["past_lengths"] and len(parity["prompt_lengths"]) >= 3 and len(parity["past_lengths"]) >= 20
    assert parity["max_abs_diff"] < 1e-4 and parity["greedy_argmax_mismatches"] == 0
    assert "left-padded batches are not supported" in parity["padded_batch"]["skipped"]
    # The cache itself: after 7 + 3 tokens, present keys/values equal transformers' (KV heads, not query heads).
    ids = np.random.default_rng(3).integers(1, 900, size=(1, 10))
    t, o = _torch(family_models[family]), _onnx(directory)
    _, ts = t.forward(ids[:, :7])
    _, os_ = o.forward(ids[:, :7])
    ref, ts = t.forward(ids[:, 7:], ts)
    got, os_ = o.forward(ids[:, 7:], os_)
    np.testing.assert_allclose(got, ref, atol=1e-4, rtol=0)
    cache = o.cache_arrays(os_)
    np.testing.assert_allclose(cache["past_key_values.1.key"], ts.cache.layers[1].keys.numpy(), atol=1e-4)
    np.testing.assert_allclose(cache["past_key_values.1.value"], ts.cache.layers[1].values.numpy(), atol=1e-4)
    assert cache["past_key_values.1.key"].shape[1] == config["num_key_value_heads"]


def test_gqa_runner_refuses_left_padding(family_stages):
    runner = _onnx(family_stages["qwen2"]["export"][0])
    with pytest.raises(InputError, match="left-padded batches are not supported"):
        runner.forward(np.array([[0, 5, 6], [7, 8, 9]]), mask=np.array([[0, 1, 1], [1, 1, 1]]))



def _greedy_steps(runner, prompt, steps):
    """Logits and states of a greedy decode, one per step (prefill included)."""
    logits, state = runner.forward(np.array([prompt]))
    out = [(logits[:, -1], state)]
    for _ in range(steps):
        logits, state = runner.forward(logits[:, -1:].argmax(-1), state)
        out.append((logits[:, -1], state))
    return out


def test_gqa_decode_writes_into_one_shared_kv_buffer_with_the_copying_paths_logits(family_stages):
    from xformopt.runtime.decoder import OrtDecoder, SharedCache

    directory = family_stages["qwen2"]["int4"][0]
    shared, copying = OrtDecoder(directory, threads=2), OrtDecoder(directory, threads=2, share_buffer=False)
    assert shared.share_buffer and not copying.share_buffer
    shared.growth_quantum = 4  # prompt 7 -> capacity 16, outgrown at step 10: the growth path runs too
    got, ref = _greedy_steps(shared, [5, 6, 7, 8, 9, 10, 11], 14), _greedy_steps(copying, [5, 6, 7, 8, 9, 10, 11], 14)
    caches = []
    for (g, g_state), (r, r_state) in zip(got, ref):
        np.testing.assert_allclose(g, r, atol=1e-5, rtol=0)
        assert isinstance(g_state.cache, SharedCache) and g_state.cache.capacity >= g_state.length
        for name, value in shared.cache_arrays(g_state).items():  # ORT wrote the new positions in place
            np.testing.assert_allclose(value, copying.cache_arrays(r_state)[name], atol=1e-5, rtol=0)
        caches.append(g_state.cache)
    assert [c.capacity for c in dict.fromkeys(caches)] == [16, 36]  # one buffer per size, reused step after step
    first, last = caches[0], caches[-1]
    name = shared.layout.past_names[0]
    assert first.values[name].data_ptr() == first.arrays[name].ctypes.data  # the OrtValue views the numpy buffer
    assert last.writes[-1] == got[-1][1].length - 1


def test_decoder_workers_spin_a_bounded_time_unless_asked_to_sleep(family_stages):
    from xformopt.runtime.decoder import OrtDecoder
    from xformopt.runtime.session import DECODER_SPIN_US

    directory = family_stages["qwen2"]["int4"][0]
    runners = {"default": OrtDecoder(directory, threads=2), "asleep": OrtDecoder(directory, threads=2, spinning=False),
               "unbounded": OrtDecoder(directory, threads=2, spin_us=None)}
    entries = {name: (r.session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning"),
                      r.session.get_session_options().get_session_config_entry("session.intra_op.spin_duration_us")
                      if name == "default" else None) for name, r in runners.items()}
    assert entries == {"default": ("1", str(DECODER_SPIN_US)), "asleep": ("0", None), "unbounded": ("1", None)}
    ids = np.array([[5, 6, 7, 8]])
    first = runners["default"].forward(ids)[0]
    for runner in runners.values():  # the same numbers either way
        np.testing.assert_array_equal(runner.forward(ids)[0], first)


def test_a_shared_buffer_state_reruns_but_a_superseded_one_refuses(family_stages):
    from xformopt.runtime.decoder import OrtDecoder, StaleStateError

    runner = OrtDecoder(family_stages["qwen2"]["export"][0], threads=2)
    _, s0 = runner.forward(np.array([[5, 6, 7]]))
    a, s1 = runner.forward(np.array([[8]]), s0)
    _, s2 = runner.forward(np.array([[9]]), s1)
    b, _ = runner.forward(np.array([[8]]), s0)  # as the benchmark does: same state, same positions rewritten
    np.testing.assert_array_equal(a, b)
    with pytest.raises(StaleStateError, match="overwritten by a later step"):
        runner.forward(np.array([[10]]), s2)  # position 3, which s2 holds, was just rewritten from s0

@pytest.mark.parametrize("family", tiny_decoders.FAMILIES)
def test_int4_packs_every_weighted_matmul_and_keeps_attention_fused(family, family_stages):
    import onnx

    directory, record = family_stages[family]["int4"]
    ops = [n.op_type for n in onnx.load(directory / "model.onnx", load_external_data=False).graph.node]
    assert record["matmulnbits"]["4bit"] == record["weighted_matmuls"] == ops.count("MatMulNBits") > 0
    assert record["kept_float"] == [] and "MatMul" not in ops
    assert ops.count("GroupQueryAttention") == LAYERS
    assert record["size_bytes"]["after"] < record["size_bytes"]["before"] / 1.8
    assert record["agreement"]["mean_agreement"] > 0.98
    # Step by step, the int4 graph decodes with its cache exactly as it does recomputing the sequence.
    from xformopt.decoder.generate import generate

    runner = _onnx(directory)
    cached, recomputed = generate(runner, [5, 6, 7, 8], 8), generate(_onnx(directory), [5, 6, 7, 8], 8, use_cache=False)
    assert cached.new_ids == recomputed.new_ids


def test_same_input_projections_pack_as_one_matmulnbits_with_the_unfused_tokens(family_stages, family_models,
                                                                                  sample_texts, tmp_path):
    """``fuse_projections`` packs each layer's gate/up (the builder already packs q/k/v): one MatMulNBits and
    a Split where there were two, recorded, and the same greedy tokens as the unfused default."""
    import onnx

    from xformopt.passes.int4.fuse import greedy_parity

    plain_dir, plain = family_stages["qwen2"]["int4"]
    assert "fused_projections" not in plain  # off by default
    ctx = make_ctx(family_models["qwen2"], sample_texts)
    record = run_pass("int4", ctx, family_stages["qwen2"]["export"][0], tmp_path / "q", fuse_projections=True)
    fused = record["fused_projections"]
    assert fused["used"] and fused["groups"] == LAYERS and fused["matmuls_fused"] == 2 * LAYERS
    assert all("/mlp/gate_up_proj/" in f["name"] and len(f["members"]) == 2 for f in fused["fused"])
    assert fused["parity"]["greedy_identical"] and fused["parity"]["max_abs_logit_diff"] < 1e-4
    assert plain["weighted_matmuls"] == record["weighted_matmuls"] + LAYERS
    ops = {name: [n.op_type for n in onnx.load(d / "model.onnx", load_external_data=False).graph.node]
           for name, d in (("fused", tmp_path / "q"), ("plain", plain_dir))}
    assert ops["plain"].count("MatMulNBits") - ops["fused"].count("MatMulNBits") == LAYERS
    assert ops["fused"].count("Split") - ops["plain"].count("Split") == LAYERS and fused["graph_nodes"] == len(ops["fused"])
    parity = greedy_parity(plain_dir, tmp_path / "q", [[5, 6, 7, 8], list(range(30, 70))], new_tokens=12)
    assert parity["greedy_identical"] and parity["max_abs_logit_diff"] < 1e-3


def test_int4_perplexity_within_5_percent_of_pytorch(family_models, family_stages):
    from xformopt.decoder.perplexity import load_token_lists, perplexity
    from xformopt.models import load_tokenizer

    model = family_models["qwen2"]
    lists, _ = load_token_lists(None, load_tokenizer(model), 128, limit=60)
    base = perplexity(_torch(model), lists)["value"]
    int4 = perplexity(_onnx(family_stages["qwen2"]["int4"][0]), lists)["value"]
    assert base < 500  # trained: far below the ~1000 of a random model with this vocabulary
    assert abs(int4 - base) / base < INT4_PPL_TOLERANCE


def test_keep_8bit_roles_pack_those_matmuls_at_8_bits(family_models, family_stages, sample_texts, tmp_path):
    ctx = make_ctx(family_models["qwen2"], sample_texts)
    record = run_pass("int4", ctx, family_stages["qwen2"]["export"][0], tmp_path / "q",
                      keep_8bit=["lm_head", "down_proj"])
    roles = sorted(r["role"] for r in record["int8_matmuls"])
    assert roles == ["down_proj"] * LAYERS + ["lm_head"] and record["matmulnbits"]["8bit"] == LAYERS + 1
    assert record["matmulnbits"]["4bit"] == record["weighted_matmuls"] - LAYERS - 1


def test_block_sizes_per_role_and_an_8bit_head_at_its_own_block(family_models, family_stages, sample_texts, tmp_path):
    import onnx

    from xformopt.decoder.traffic import role_of

    ctx = make_ctx(family_models["qwen2"], sample_texts)
    record = run_pass("int4", ctx, family_stages["qwen2"]["export"][0], tmp_path / "q", keep_8bit=["lm_head"],
                      block_sizes="down_proj=64,lm_head=16")
    assert record["block_sizes"] == {"down_proj": 64, "lm_head": 16}
    seen = {}
    for node in onnx.load(tmp_path / "q" / "model.onnx", load_external_data=False).graph.node:
        if node.op_type == "MatMulNBits":
            attrs = {a.name: a.i for a in node.attribute}
            seen.setdefault(role_of(node.name), set()).add((attrs["bits"], attrs["block_size"]))
    assert seen.pop("down_proj") == {(4, 64)} and seen.pop("lm_head") == {(8, 16)}
    assert set().union(*seen.values()) == {(4, 32)}  # every other role at block_size
    assert record["agreement"]["mean_agreement"] > 0.98


def test_int8_kv_cache_halves_nothing_but_the_cache_and_keeps_perplexity(family_models, family_stages, sample_texts,
                                                                          tmp_path):
    """kv_cache int8: every GroupQueryAttention keeps K and V at 8 bits with calibrated per-channel
    scales; the graph's cache inputs are int8, the shared-buffer decode runs on int8 buffers, and
    perplexity stays within 2% of the same weights with a float cache."""
    import onnx

    from xformopt.decoder.perplexity import load_token_lists, perplexity
    from xformopt.decoder.traffic import onnx_step_bytes
    from xformopt.models import load_tokenizer
    from xformopt.runtime.decoder import SharedCache

    model = family_models["qwen2"]
    out = tmp_path / "kv8"
    record = run_pass("int4", make_ctx(model, sample_texts), family_stages["qwen2"]["export"][0], out,
                      kv_cache="int8", calibration_limit=16)
    assert record["kv_cache"]["type"] == "int8" and record["kv_cache"]["caches"] == 2 * LAYERS
    graph = onnx.load(out / "model.onnx", load_external_data=False).graph
    gqa = [n for n in graph.node if n.op_type == "GroupQueryAttention"]
    assert len(gqa) == LAYERS
    for node in gqa:
        attrs = {a.name: a for a in node.attribute}
        assert attrs["kv_cache_bit_width"].i == 8 and attrs["k_quant_type"].s == b"PER_CHANNEL"
    inits = {i.name: i for i in graph.initializer}
    scales = [inits[n.input[12]] for n in gqa] + [inits[n.input[13]] for n in gqa]
    shape = tiny_decoders.SHAPE
    channels = shape["num_key_value_heads"] * shape["hidden_size"] // shape["num_attention_heads"]
    assert all(list(s.dims) == [channels] for s in scales)
    past = [i for i in graph.input if i.name.startswith("past_key_values.")]
    assert past and {i.type.tensor_type.elem_type for i in past} == {onnx.TensorProto.INT8}

    runner = _onnx(out)
    _, state = runner.forward(np.array([[5, 6, 7, 8]]))
    assert isinstance(state.cache, SharedCache)
    assert {a.dtype for a in runner.cache_arrays(state).values()} == {np.dtype(np.int8)}
    float_kv = family_stages["qwen2"]["int4"][0]
    step = onnx_step_bytes(out), onnx_step_bytes(float_kv)
    assert step[0].kv_per_position * 4 == step[1].kv_per_position and step[0].kv_dtype == "int8"

    lists, _ = load_token_lists(None, load_tokenizer(model), 128, limit=40)
    with_int8, with_float = perplexity(runner, lists)["value"], perplexity(_onnx(float_kv), lists)["value"]
    assert abs(with_int8 - with_float) / with_float < 0.02


def test_int8_kv_cache_needs_grouped_query_attention(family_models, family_stages, sample_texts, tmp_path):
    """A decoder whose attention is not GroupQueryAttention (the dynamo path's MultiHeadAttention, say)
    is refused before any work: no other op takes an int8 cache."""
    import shutil

    import onnx

    stage = tmp_path / "mha"
    shutil.copytree(family_stages["qwen2"]["export"][0], stage)
    model = onnx.load(stage / "model.onnx", load_external_data=False)
    for node in model.graph.node:
        if node.op_type == "GroupQueryAttention":
            node.op_type = "MultiHeadAttention"
    onnx.save(model, stage / "model.onnx")
    with pytest.raises(InputError, match="no GroupQueryAttention"):
        run_pass("int4", make_ctx(family_models["qwen2"], sample_texts), stage, tmp_path / "q", kv_cache="int8")
    assert not any((tmp_path / "q").iterdir())  # the helper made the folder; the pass wrote nothing in it


def test_perplexity_budget_moves_the_most_harmful_matmuls_to_8_bits(family_models, family_stages, sample_texts, tmp_path):
    """A budget of 0% cannot be met by the all-4-bit candidate: the search ranks by harm, tries
    1, 2, 4 ... MatMuls at 8 bits, and writes the fewest that meet it (or the best, flagged)."""
    from xformopt.decoder.perplexity import perplexity, token_lists
    from xformopt.models import load_tokenizer
    from xformopt.passes.quantize import calibration as cal

    model = family_models["qwen2"]
    ctx = make_ctx(model, sample_texts)
    out = tmp_path / "q"
    record = run_pass("int4", ctx, family_stages["qwen2"]["export"][0], out, block_size=16,
                      max_perplexity_increase="0%", perplexity_texts=32, max_8bit_nodes=4)
    budget = record["budget"]
    search = budget["search"]
    assert search[0]["extra_8bit"] == 0 and not search[0]["passes"] and len(search) >= 2
    ranking = budget["harm_ranking"]
    assert [r["harm"] for r in ranking] == sorted((r["harm"] for r in ranking), reverse=True)
    ranked = [r["name"] for r in ranking]
    for row in search:
        assert row["moved_to_8bit"] == ranked[: row["extra_8bit"]]
    passing = [r["extra_8bit"] for r in search if r["passes"]]
    assert budget["budget_met"] == bool(passing)
    if passing:
        assert budget["chosen"] == min(passing)
    assert record["matmulnbits"]["8bit"] == budget["chosen"]
    # The recorded perplexity is the written artifact's.
    dataset = cal.load_split(None, "validation", ctx.spec, 32, 0, labels=False)
    lists = token_lists(dataset.texts, load_tokenizer(model), 128, 128)
    assert perplexity(_onnx(out), lists)["value"] == pytest.approx(budget["perplexity_after"], rel=1e-4)


@pytest.mark.parametrize("algorithm", ["hqq", "gptq"])
def test_hqq_and_gptq_write_4bit_matmulnbits(algorithm, family_models, family_stages, sample_texts, tmp_path):
    ctx = make_ctx(family_models["qwen2"], sample_texts)
    record = run_pass("int4", ctx, family_stages["qwen2"]["export"][0], tmp_path / "q",
                      algorithm=algorithm, calibration_limit=8)
    assert record["algorithm"] == algorithm and record["matmulnbits"]["4bit"] == record["weighted_matmuls"]
    assert record["matmulnbits"]["accuracy_levels"] == [4]  # ORT's HQQ writes none: the pass sets it
    assert ("calibration" in record) == (algorithm == "gptq")
    assert record["agreement"]["mean_agreement"] > 0.98


def test_int4_bad_input_fails_before_any_work(family_stages, exported_classifier, tmp_path, capsys):
    export_dir, int4_dir = family_stages["qwen2"]["export"][0], family_stages["qwen2"]["int4"][0]
    code, _, err = run_cli(["int4", int4_dir, "-o", tmp_path / "b"], capsys)
    assert code == 2 and "already 4-bit" in err and not (tmp_path / "b").exists()
    code, _, err = run_cli(["int4", exported_classifier[0], "-o", tmp_path / "c"], capsys)
    assert code == 2 and "for pass 'int4': text-classification models support" in err and not (tmp_path / "c").exists()
    code, _, err = run_cli(["int4", export_dir, "-o", tmp_path / "d", "--max-perplexity-increase", "lots"], capsys)
    assert code == 2 and "max_perplexity_increase" in err
    code, _, err = run_cli(["int4", export_dir, "-o", tmp_path / "e", "--block-size", "48"], capsys)
    assert code == 2 and "block_size must be 16, 32, 64, 128 or 256" in err and not (tmp_path / "e").exists()
    # ORT's GPTQ packs asymmetric zero points two to a byte per weight: an odd block count is refused up front
    code, _, err = run_cli(["int4", export_dir, "-o", tmp_path / "f", "--algorithm", "gptq", "--no-symmetric",
                            "--block-size", "64"], capsys)
    assert code == 2 and "odd number for input size 64" in err and "block_size 16 or 32" in err
    assert not (tmp_path / "f").exists()


def test_int4_records_no_int8_options_and_int8_none_of_int4s():
    """int4 is its own pass: neither options model carries the other's fields (nor its manifest entry)."""
    from xformopt.passes.int4.run import Int4Options
    from xformopt.passes.quantize.run import QuantizeOptions

    int8, int4 = set(QuantizeOptions.model_fields), set(Int4Options.model_fields)
    assert not {"block_size", "algorithm", "keep_8bit", "max_perplexity_increase", "carry_gguf"} & int8
    assert not {"mode", "per_channel", "weight_type", "op_types", "max_accuracy_drop"} & int4
    with pytest.raises(ValidationError, match="perplexity budget"):
        Int4Options.model_validate({"max_accuracy_drop": 0.5})


def test_an_old_quantize_int4_recipe_is_refused_naming_the_new_step(tmp_path, capsys):
    """Recipes written before the split (``quantize: {mode: int4}``) are refused in one line naming the fix."""
    old = tmp_path / "old.yaml"
    old.write_text("name: old\npasses:\n  - export\n  - quantize:\n      mode: int4\n      block_size: 16\n")
    with pytest.raises(InputError) as info:
        recipe.load(str(old))
    assert info.value.message.startswith(f"{old}:5: passes.1.quantize.mode: quantize mode int4 is its own pass now")
    assert "`int4: {...}`" in info.value.message
    code, _, err = run_cli(["optimize", "x", "-o", tmp_path / "o", "--recipe", old], capsys)
    assert code == 2 and "its own pass now" in err and not (tmp_path / "o").exists()


@pytest.mark.parametrize("family", ["llama", "phi3"])
def test_without_the_builder_exports_group_query_attention_through_dynamo_loudly(family, family_models, sample_texts,
                                                                                 tmp_path, monkeypatch):
    """No genai extra: torch's dynamo exporter writes GroupQueryAttention itself (xformopt/passes/export/decoder_gqa.py:
    the builder's layout, no position_ids, parity at every step; left padding skipped, as for the builder's graphs),
    and fuse keeps it and fuses the RMSNorms, counted per layer. Phi-3: fused qkv/gate-up projections."""
    import xformopt.families as families

    monkeypatch.setattr(families, "genai_builder_available", lambda: False)
    ctx = make_ctx(family_models[family], sample_texts)
    record = run_pass("export", ctx, family_models[family], tmp_path / "e")
    assert "decoder_gqa" in record["exporter"] and "fused" not in record and record["cache_layout"] == "split"
    assert "position_ids" not in record["inputs"] and "skipped" in record["parity"]["padded_batch"]
    assert record["parity"]["max_abs_diff"] < 1e-4 and record["parity"]["greedy_argmax_mismatches"] == 0
    assert any("onnxruntime-genai is not installed" in m for m in ctx.messages)
    fused = run_pass("fuse", make_ctx(family_models[family], sample_texts), tmp_path / "e", tmp_path / "f", select="all")
    assert fused["expected"] == {"GroupQueryAttention": LAYERS, "SkipSimplifiedLayerNormalization": 2 * LAYERS}
    assert fused["fused_kept"]["GroupQueryAttention"] == LAYERS and fused["decoder"]["attention_fused"] is True


def test_cli_optimize_int4_recipe_generates_and_benches(family_models, tmp_path, capsys):
    out = tmp_path / "o"
    code, stdout, err = run_cli(["optimize", family_models["qwen2"], "-o", out, "--recipe", "int4", "--limit", "24",
                                 "--no-cache"], capsys)
    assert code == 0, err
    manifest = json.loads((out / "manifest.json").read_text())
    int4 = next(p for p in manifest["passes"] if p["pass"] == "int4")["record"]
    assert int4["budget"]["budget_met"] and int4["matmulnbits"]["4bit"] >= 10
    report = json.loads((out / "report.json").read_text())
    assert [s["name"] for s in report["stages"]] == ["pytorch", "export", "int4"]
    assert "4-bit" in stdout and "MatMulNBits" in (out / "report.md").read_text()  # the graph table says what ran
    base, final = (report["stages"][i]["metrics"]["perplexity"]["value"] for i in (0, -1))
    assert abs(final - base) / base < INT4_PPL_TOLERANCE
    code, text, err = run_cli(["generate", out, "The movie was", "-n", "6", "--ignore-eos"], capsys)
    assert code == 0 and "6 tokens in" in err
    from xformopt.decoder.generate import generate
    from xformopt.models import load_tokenizer
    from xformopt.runtime.decoder import OrtDecoder

    tokenizer = load_tokenizer(out)
    greedy = generate(OrtDecoder(out, threads=2), list(tokenizer("The movie was")["input_ids"]), 6).new_ids
    assert text == tokenizer.decode(greedy, skip_special_tokens=True) + "\n"  # the artifact's greedy text, whole
    code, doc, _ = run_cli(["bench", out, "--prompt-tokens", "8", "--new-tokens", "4", "--rounds", "3", "--json"], capsys)
    results = json.loads(doc)["cells"][0]["results"]
    assert code == 0 and set(results) == {"pytorch", "int4"}  # bench finds PyTorch through the manifest
    assert results["int4"]["cache"]["per_token"]["n"] == 3 * 3


def test_int4_artifact_runs_in_onnxruntime_genai_with_the_same_greedy_tokens(family_stages):
    import onnxruntime_genai as og

    from xformopt.decoder.generate import generate

    directory = family_stages["qwen2"]["int4"][0]
    assert (directory / "genai_config.json").is_file()  # the builder's runtime config travels with the stage
    model = og.Model(str(directory))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=16, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(np.array([[5, 6, 7, 8]], dtype=np.int32))
    tokens = []
    while not generator.is_done():
        generator.generate_next_token()
        tokens.append(int(generator.get_next_tokens()[0]))
    assert tokens and tokens == generate(_onnx(directory), [5, 6, 7, 8], len(tokens)).new_ids[: len(tokens)]


def test_a_missed_perplexity_budget_fails_the_run_with_its_numbers(tmp_path):
    from xformopt.errors import GateFailed
    from xformopt.passes.record import PassRecord
    from xformopt.pipeline import raise_if_budget_missed

    record = {"budget_met": False, "budget": {"max_perplexity_increase": "1%", "float_perplexity": 100.0,
                                              "perplexity_after": 103.0, "increase": 0.03, "allowed_increase": 0.01,
                                              "max_extra_8bit": 5}}
    with pytest.raises(GateFailed, match=r"perplexity budget not met: 100.000 -> 103.000 \(\+3.00% > 1.00%\)"):
        raise_if_budget_missed([PassRecord("int4", record)], tmp_path)
