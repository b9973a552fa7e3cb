"""Served INT8 answers do not depend on their batch mates (xformopt.runtime.per_token_int8): every
per-tensor dynamic quantization (DynamicQuantizeLinear -> MatMulInteger, fused QAttention, ORT's
DynamicQuantizeMatMul) is rewritten to per-token scales in memory, for every encoder task, fused or
unfused attention; and sessions over the rewrite compute what the unfused graph computes."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from xformopt.runtime.per_token_int8 import ATTENTION_MODES, PER_TENSOR_OPS


def _quantized(tmp_path_factory, model_dir, stage, texts, name):
    from helpers import make_ctx, run_pass

    dst = tmp_path_factory.mktemp("int8") / name
    run_pass("quantize", make_ctx(model_dir, texts), stage, dst)
    return dst


def _ort_quantized(tmp_path_factory, stage, name):
    """ORT's own dynamic quantizer over an exported stage (what the quantize pass runs)."""
    from onnxruntime.quantization import quantize_dynamic

    dst = tmp_path_factory.mktemp("int8") / name
    shutil.copytree(stage, dst)
    quantize_dynamic(stage / "model.onnx", dst / "model.onnx")
    return dst


@pytest.fixture(scope="module")
def int8_classifier(tmp_path_factory, tiny_classifier, exported_classifier, sample_texts):
    return _quantized(tmp_path_factory, tiny_classifier, exported_classifier[0], sample_texts, "unfused")


@pytest.fixture(scope="module")
def int8_artifacts(tmp_path_factory, int8_classifier, tiny_classifier, fused_classifier, tiny_encoder, fused_encoder,
                   served_tagger, served_reader, sample_texts):
    """One dynamic-INT8 graph per form: unfused/fused attention, each encoder task, and a graph saved
    after ORT's own fusions (DynamicQuantizeMatMul)."""
    from xformopt.runtime.session import ort_session

    fused = _quantized(tmp_path_factory, tiny_classifier, fused_classifier[0], sample_texts, "fused")
    ort_fused = tmp_path_factory.mktemp("int8") / "ort-fused"
    shutil.copytree(fused, ort_fused)
    (ort_fused / "model.onnx").unlink()
    ort_session(fused / "model.onnx", 1, "extended", optimized_path=str(ort_fused / "model.onnx"))
    return {
        "classifier-unfused": int8_classifier,
        "classifier-QAttention": fused,
        "classifier-DynamicQuantizeMatMul": ort_fused,
        "embedder-QAttention": _quantized(tmp_path_factory, tiny_encoder, fused_encoder, sample_texts, "embedder"),
        "tagger-unfused": _ort_quantized(tmp_path_factory, served_tagger, "tagger"),
        "reader-unfused": _ort_quantized(tmp_path_factory, served_reader, "reader"),
    }


def _ops(path) -> set[str]:
    import onnx

    return {n.op_type for n in onnx.load(str(path / "model.onnx"), load_external_data=False).graph.node}


def _alone_and_batched(predictor, texts):
    """Each row's outputs run alone and run in one batch with all the others (padding included)."""
    if predictor.task == "question-answering":
        texts = [{"question": "what is it about?", "context": t} for t in texts]
    rows = [p.rows[0] for p in predictor.prepare(texts)]
    alone = [predictor.run_rows([r])[0] for r in rows]
    return alone, predictor.run_rows(rows)


def _mates(sample_texts):
    # short and long rows, and one row whose activations dwarf the others' (it sets a per-tensor scale)
    return sample_texts[:20] + [" ".join(["!"] * 30), "absolutely " * 12]


@pytest.mark.parametrize("form", ["classifier-unfused", "classifier-QAttention", "classifier-DynamicQuantizeMatMul",
                                  "embedder-QAttention", "tagger-unfused", "reader-unfused"])
@pytest.mark.parametrize("attention", ATTENTION_MODES)
def test_every_served_int8_form_answers_each_row_as_it_answers_it_alone(int8_artifacts, form, attention, sample_texts,
                                                                        tmp_path):
    import onnx

    from xformopt.runtime.per_token_int8 import remaining_per_tensor, rewritten_copy
    from xformopt.runtime.predictor import load_predictor

    artifact = int8_artifacts[form]
    assert _ops(artifact) & set(PER_TENSOR_OPS)
    if form.endswith("QAttention"):
        assert "QAttention" in _ops(artifact)
    if form.endswith("DynamicQuantizeMatMul"):
        assert "DynamicQuantizeMatMul" in _ops(artifact)
    path, count = rewritten_copy(artifact / "model.onnx", tmp_path, attention)
    assert count > 0 and remaining_per_tensor(onnx.load(str(path))) == 0
    predictor = load_predictor(artifact, threads=1, int8_attention=attention)
    alone, batched = _alone_and_batched(predictor, _mates(sample_texts))
    for a, b in zip(alone, batched):
        np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("form", ["classifier-unfused", "classifier-QAttention"])
def test_as_exported_the_same_rows_do_depend_on_their_batch_mates(int8_artifacts, form, sample_texts):
    """The check above can fail: per-tensor scales (the graph as exported) change rows with their mates."""
    from xformopt.runtime.predictor import load_predictor

    predictor = load_predictor(int8_artifacts[form], threads=1, int8_scales="per-tensor")
    alone, batched = _alone_and_batched(predictor, _mates(sample_texts))
    assert max(float(np.abs(a - b).max()) for a, b in zip(alone, batched)) > 1e-4


def test_served_answers_stay_close_to_the_graph_as_exported(int8_artifacts, sample_texts):
    """The rewrite changes how activations are rounded, not what the model computes."""
    from xformopt.runtime.predictor import load_predictor

    artifact = int8_artifacts["classifier-QAttention"]
    texts = sample_texts[:16]
    exported = load_predictor(artifact, threads=1, int8_scales="per-tensor")
    want = [exported.run_rows([p.rows[0]])[0] for p in exported.prepare(texts)]
    for attention in ATTENTION_MODES:
        served = load_predictor(artifact, threads=1, int8_attention=attention)
        got = [served.run_rows([p.rows[0]])[0] for p in served.prepare(texts)]
        assert max(float(np.abs(a - b).max()) for a, b in zip(got, want)) < 0.05
    before = (artifact / "model.onnx").read_bytes()
    load_predictor(artifact, threads=1)
    assert (artifact / "model.onnx").read_bytes() == before  # the artifact is never rewritten


def test_the_rewrite_computes_what_the_unfused_graph_computes(int8_classifier, sample_texts, tmp_path):
    from xformopt.runtime.per_token_int8 import DISABLED_OPTIMIZERS, rewritten_copy
    from xformopt.runtime.predictor import load_predictor
    from xformopt.runtime.session import ort_feed, ort_session

    path, count = rewritten_copy(int8_classifier / "model.onnx", tmp_path)
    assert count > 0
    encoded = load_predictor(int8_classifier, threads=1).runner.tokenize(sample_texts[:8])
    outputs = []
    for level, disabled in (("basic", ()), ("all", DISABLED_OPTIMIZERS)):
        session = ort_session(path, 1, level, disabled_optimizers=disabled)
        outputs.append(session.run(None, ort_feed(encoded, [i.name for i in session.get_inputs()]))[0])
    np.testing.assert_allclose(outputs[0], outputs[1], atol=1e-4)
