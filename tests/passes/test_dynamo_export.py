"""``export: {exporter: dynamo}`` on the tiny BERT: parity, every layer fused (by onnxscript's rewriter
in ``fuse``), quantized, run in a transformers pipeline, and a whole optimize run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import TINY, make_ctx, onnx_op_counts, run_pass

from xformopt import pipeline, recipe
from xformopt.errors import InputError
from xformopt.onnx_graph import load_graph
from xformopt.passes.export.dynamo import is_dynamo_graph

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
LAYERS = TINY["layers"]


@pytest.fixture(scope="module")
def dynamo_classifier(tmp_path_factory, tiny_classifier, sample_texts) -> tuple[Path, dict]:
    dst = tmp_path_factory.mktemp("dynamo") / "exported"
    record = run_pass("export", make_ctx(tiny_classifier, sample_texts), tiny_classifier, dst, exporter="dynamo")
    return dst, record


@pytest.fixture(scope="module")
def dynamo_fused(tmp_path_factory, tiny_classifier, dynamo_classifier, sample_texts) -> tuple[Path, dict]:
    dst = tmp_path_factory.mktemp("dynamo") / "fused"
    record = run_pass("fuse", make_ctx(tiny_classifier, sample_texts), dynamo_classifier[0], dst, select="all")
    return dst, record


def test_dynamo_export_layout_and_parity(dynamo_classifier):
    stage, record = dynamo_classifier
    assert record["exporter"].startswith("torch.onnx.export (dynamo=True)")
    assert record["opset"] >= 18
    assert record["inputs"] == ["input_ids", "attention_mask", "token_type_ids"]
    assert record["outputs"] == ["logits"]
    for name, dims in record["dynamic_axes"].items():
        assert len(dims) == 2 and all(dims) and dims[0] != dims[1], (name, dims)
    parity = record["parity"]
    assert parity["max_abs_diff"] <= 1e-3 and parity["min_cosine"] >= 0.9999
    assert len(set(parity["sequence_lengths"])) >= 3 and 2 in parity["batch_sizes"]  # several lengths, padded batch
    for name in ("config.json", "tokenizer.json", "vocab.txt"):
        assert (stage / name).is_file(), name
    model = load_graph(stage / "model.onnx")
    assert is_dynamo_graph(model)
    # the export itself is unfused: every fusion is the fuse pass's, and counted there
    assert onnx_op_counts(stage / "model.onnx")["Attention"] == 0


def test_dynamo_export_fuses_every_layer(dynamo_fused):
    stage, record = dynamo_fused
    assert record["fusion_route"].startswith("onnxscript")
    assert record["fused_before"]["Attention"] == 0
    assert record["fused_possible"]["Attention"] == LAYERS
    assert record["fused_possible"]["SkipLayerNormalization"] == 2 * LAYERS
    assert record["expected"] == {"Attention": LAYERS, "SkipLayerNormalization": 2 * LAYERS}
    counts = onnx_op_counts(stage / "model.onnx")
    assert counts["Attention"] == LAYERS and counts["SkipLayerNormalization"] == 2 * LAYERS


def test_dynamo_no_attention_candidate_leaves_attention(tiny_classifier, dynamo_classifier, sample_texts, tmp_path):
    from xformopt.passes.fuse.run import build_fused

    ctx = make_ctx(tiny_classifier, sample_texts)
    counts = build_fused(dynamo_classifier[0] / "model.onnx", tmp_path / "model.onnx", ctx, ("enable_attention",))
    assert counts["Attention"] == 0 and counts["SkipLayerNormalization"] == 2 * LAYERS


def test_dynamo_fused_matches_torchscript_fused(dynamo_fused, fused_classifier, tiny_classifier, sample_texts):
    from xformopt.runtime.encoder import OrtPredictor, TorchPredictor
    from xformopt.sources import resolve

    spec = resolve(str(tiny_classifier))
    texts = sample_texts[:8]
    dynamo = OrtPredictor(spec, dynamo_fused[0], threads=1).predict(texts)
    torchscript = OrtPredictor(spec, fused_classifier[0], threads=1).predict(texts)
    reference = TorchPredictor(spec, tiny_classifier, threads=1).predict(texts)
    np.testing.assert_allclose(dynamo, torchscript, atol=1e-4)
    np.testing.assert_allclose(dynamo, reference, atol=1e-4)


def test_dynamo_fused_quantizes(dynamo_fused, tiny_classifier, sample_texts, tmp_path):
    record = run_pass("quantize", make_ctx(tiny_classifier, sample_texts), dynamo_fused[0], tmp_path / "q")
    counts = onnx_op_counts(tmp_path / "q" / "model.onnx")
    assert counts["QAttention"] == LAYERS, record
    assert counts["MatMulInteger"] + counts["DynamicQuantizeMatMul"] > 0


def test_dynamo_export_without_onnxscript_names_the_extra(monkeypatch, tiny_classifier, sample_texts, tmp_path):
    import builtins

    real_import = builtins.__import__

    def no_onnxscript(name, *args, **kwargs):
        if name.startswith("onnxscript"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_onnxscript)
    with pytest.raises(InputError, match=r"pip install 'onnxscript"):
        run_pass("export", make_ctx(tiny_classifier, sample_texts), tiny_classifier, tmp_path / "x", exporter="dynamo")


def test_optimize_with_dynamo_recipe(tmp_path, tiny_classifier, heldout_file, sample_texts, monkeypatch):
    from transformers import AutoTokenizer

    from xformopt.clients.transformers_pipeline import OnnxPipelineModel

    monkeypatch.setenv("XFORMOPT_CACHE_DIR", str(tmp_path / "cache"))
    chosen = recipe.validate({
        "name": "dynamo",
        "target": "auto",
        "passes": [{"export": {"exporter": "dynamo"}}, {"fuse": {"select": "all"}}, "quantize"],
        "evaluation": {"data": str(heldout_file), "limit": 16, "latency_rounds": 3, "warmup": 1},
    })
    result = pipeline.run(str(tiny_classifier), chosen, tmp_path / "out")
    out = result.out
    counts = onnx_op_counts(out / "model.onnx")
    assert counts["QAttention"] == LAYERS
    model = OnnxPipelineModel(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    logits = np.asarray(model(**tokenizer(sample_texts[:4], padding=True, return_tensors="np")).logits)
    assert logits.shape == (4, 2)


def test_cli_export_dynamo_keeps_stdout_json(tiny_classifier, heldout_file, tmp_path, capsys):
    """The dynamo exporter prints its progress; `--json` stdout must stay one JSON document."""
    import json

    from helpers import run_cli

    code, out, err = run_cli(["export", tiny_classifier, "-o", tmp_path / "e", "--exporter", "dynamo",
                              "--data", heldout_file, "--json"], capsys)
    assert code == 0, err
    entry = json.loads(out)
    assert entry["options"]["exporter"] == "dynamo"
    assert entry["record"]["exporter"].startswith("torch.onnx.export (dynamo=True)")


def test_product_dims_are_written_in_one_order():
    """onnxscript compares shapes by dimension name: ``num_choices*batch_size`` and ``batch_size*num_choices``
    (a multiple-choice export names both) must read the same; other names and sums are left alone."""
    import onnx_ir as ir
    from onnx import TensorProto, helper

    from xformopt.passes.export.dynamo import canonical_product_dims

    shapes = {"a": ["num_choices*batch_size", "sequence_length", 4], "b": ["batch_size*num_choices", "sequence_length", 4],
              "c": ["s0 + 1", 3, "batch"]}
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["y"])], "g",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, dims) for name, dims in shapes.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["num_choices*batch_size", "sequence_length", 4])])
    model = ir.from_proto(helper.make_model(graph))
    assert canonical_product_dims(model) == 2  # a and y (b is already in order; c has no product)
    dims = {v.name: [str(d) for d in v.shape.dims] for v in (*model.graph.inputs, *model.graph.outputs)}
    assert dims["a"] == dims["b"] == dims["y"] == ["batch_size*num_choices", "sequence_length", "4"]
    assert dims["c"] == ["s0 + 1", "3", "batch"]
