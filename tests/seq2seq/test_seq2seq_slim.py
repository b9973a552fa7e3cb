"""Leaner decoder steps (issue 55, xformopt/seq2seq/slim.py) on the tiny T5 trained in code: fuse slims the fused
decoder graph (fewer nodes; T5's position-bias arithmetic, the cross-attention mask's and the cache transposes gone)
and removes both graphs' reshape/transpose round trips; the outputs equal the fused graphs' before the rewrites, and
the tokens are transformers' on the 100 held-out sources, through the Python loop (padded batches) and through the
BeamSearch op (one source at a time)."""

from __future__ import annotations

import json
import shutil
from collections import Counter

import numpy as np
import onnx
import pytest
from helpers import make_ctx, run_pass
from test_seq2seq import _cut, _export, _hf_generate

from xformopt.resources import word_seq2seq_path
from xformopt.seq2seq import DECODER_FILE, ENCODER_FILE
from xformopt.seq2seq.generate import GenerationSettings, generate
from xformopt.seq2seq.identity_layouts import drop_identity_layouts
from xformopt.seq2seq.parity import check_parity
from xformopt.seq2seq.runner import OrtSeq2Seq
from xformopt.seq2seq.search_graph import open_search_graph
from xformopt.seq2seq.slim import slim_decoder

pytestmark = pytest.mark.filterwarnings("ignore")
MAX_NEW = 16
GONE = ("Log", "GatherND", "Range", "Transpose")  # bucket arithmetic, mask gathering, cache transposes


@pytest.fixture(scope="module")
def fused(trained_t5_src, tmp_path_factory):
    """The trained T5's export, fused (and so slimmed) by the pass, and the fused graphs without the rewrites."""
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("t5-slim")
    stage = _export(trained_t5_src, root / "onnx")
    sources = [json.loads(line)["source"] for line in word_seq2seq_path("reverse", "test").read_text().splitlines()]
    record = run_pass("fuse", make_ctx(trained_t5_src, sources[:8]), stage, root / "fused", select="all")
    unslimmed = root / "unslimmed"
    shutil.copytree(root / "fused", unslimmed)
    from xformopt.passes.export.dynamo import onnxscript_fusions

    for name in (ENCODER_FILE, DECODER_FILE):  # the fused graphs, not slimmed
        onnxscript_fusions(stage / name, unslimmed / name)
    return root / "fused", unslimmed, record, AutoTokenizer.from_pretrained(trained_t5_src), sources, trained_t5_src


def _ops(path) -> Counter:
    return Counter(n.op_type for n in onnx.load(str(path)).graph.node)


def test_fuse_slims_the_decoder_and_records_it(fused):
    slimmed, unslimmed, record, *_ = fused
    slim = record["slim"][DECODER_FILE]
    before, after = _ops(unslimmed / DECODER_FILE), _ops(slimmed / DECODER_FILE)
    assert slim["nodes_before"] == sum(before.values()) and slim["nodes_after"] == sum(after.values())
    assert slim["nodes_after"] < 0.5 * slim["nodes_before"], slim
    assert {k: slim["applied"][k] for k in ("cross_attention_layout", "position_bias", "cross_attention_mask")} == \
        {"cross_attention_layout": 2, "position_bias": 1, "cross_attention_mask": 1}
    assert all(before[op] for op in GONE) and not any(after[op] for op in GONE), (before, after)
    assert after["MultiHeadAttention"] == before["MultiHeadAttention"] == 4


def test_fuse_slims_the_encoder_graph(fused):
    """Head splits straight back for MultiHeadAttention and the first step's output round trips go; the cache outputs
    come from the attention nodes (no head splits left); T5's bidirectional position bias and the padding mask are a
    clipped table gather, and a Where per masked bias (no log, bucket arithmetic or GatherND)."""
    slimmed, unslimmed, record, *_ = fused
    slim = record["slim"][ENCODER_FILE]
    before, after = _ops(unslimmed / ENCODER_FILE), _ops(slimmed / ENCODER_FILE)
    assert slim["nodes_before"] == sum(before.values()) and slim["nodes_after"] == sum(after.values())
    assert slim["applied"]["identity_layouts"] > 0 and before["Reshape"] > 0 == after["Reshape"], (before, after)
    # the encoder's bias, the first step's self-attention bias and its cross-attention mask; 2 layers x self and cross
    assert slim["applied"]["attention_bias"] == 3 and slim["applied"]["present_from_attention"] == 4, slim
    gone = ("Log", "Abs", "GatherND", "Transpose")  # bucket arithmetic, mask gathering, head splits
    assert all(before[op] for op in gone) and not any(after[op] for op in gone), (before, after)
    assert after["Where"] == 2 and after["Clip"] == 1 and not after["Identity"], after
    assert after["MultiHeadAttention"] == before["MultiHeadAttention"]
    assert slim["nodes_after"] < 0.5 * slim["nodes_before"], slim


def test_a_transpose_that_reorders_elements_is_kept(tmp_path):
    """Reshape [2, 3, 4] -> [2, 3, 2, 2], Transpose (0, 2, 1, 3), Reshape back to [2, 3, 4]: same shape, other
    order; only a round trip that keeps the order goes."""
    from onnx import TensorProto, helper, numpy_helper

    shape = numpy_helper.from_array(np.array([2, 3, 2, 2], np.int64), "split")
    back = numpy_helper.from_array(np.array([2, 3, 4], np.int64), "back")
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "split"], ["a"]), helper.make_node("Transpose", ["a"], ["b"], perm=[0, 2, 1, 3]),
         helper.make_node("Reshape", ["b", "back"], ["swapped"]), helper.make_node("Reshape", ["a", "back"], ["same"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None), helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        [shape, back])
    graph.node.extend([helper.make_node("Identity", ["swapped"], ["y"]), helper.make_node("Identity", ["same"], ["z"])])
    path = tmp_path / "g.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    got = drop_identity_layouts(path)
    ops = _ops(path)
    assert got["chains"] == 1 and ops["Transpose"] == 1 and ops["Reshape"] == 2, (got, ops)
    z = next(n for n in onnx.load(str(path)).graph.node if n.output[0] == "z")
    assert z.input[0] == "x"


def test_slimmed_graphs_equal_the_fused_ones(fused):
    """Encoder, first step and cached steps on sources of several lengths and a padded batch of two."""
    slimmed, unslimmed, _, tokenizer, sources, _ = fused
    parity = check_parity(OrtSeq2Seq(unslimmed, threads=1), OrtSeq2Seq(slimmed, threads=1), tokenizer, sources,
                          steps=6)
    assert max(parity["max_abs_diff_by_output"].values()) <= 1e-5, parity
    assert 2 in parity["batch_sizes"]


def test_slimmed_graph_takes_one_token_per_step(fused):
    """The position table gives one query row: two tokens in a step are refused by ONNX Runtime, not mis-biased."""
    slimmed, _, _, tokenizer, sources, _ = fused
    runner = OrtSeq2Seq(slimmed, threads=1)
    enc = tokenizer([sources[0]], return_tensors="np")
    _, cache = runner.start(enc["input_ids"], enc["attention_mask"])
    with pytest.raises(Exception, match="decoder_input_ids"):
        runner.step(np.array([[3, 4]], dtype=np.int64), cache)


@pytest.mark.parametrize("beams", [1, 4])
def test_slimmed_graphs_give_transformers_tokens(fused, beams):
    slimmed, _, _, tokenizer, sources, src = fused
    settings = GenerationSettings.from_model_dir(slimmed).with_(max_new_tokens=MAX_NEW, num_beams=beams)
    loop = OrtSeq2Seq(slimmed, threads=1)
    op = OrtSeq2Seq(slimmed, threads=1, search=open_search_graph(slimmed, 1))
    assert op.search is not None  # fuse wrote generate.onnx over the slimmed graphs
    theirs, batched, one_by_one = [], [], []
    for i in range(0, len(sources), 10):
        enc = tokenizer(sources[i:i + 10], padding=True, return_tensors="np")
        theirs += _hf_generate(src, enc, max_new_tokens=MAX_NEW, num_beams=beams)
        batched += _cut(generate(loop, enc["input_ids"], enc["attention_mask"], settings))
    for text in sources:
        enc = tokenizer([text], return_tensors="np")
        one_by_one += generate(op, enc["input_ids"], enc["attention_mask"], settings)
    assert len(theirs) == 100 and batched == theirs and one_by_one == theirs


def test_a_graph_without_fused_attention_is_left_as_it_is(fused, tmp_path):
    _, _, _, _, _, src = fused
    stage = _export(src, tmp_path / "onnx")
    before = (stage / DECODER_FILE).read_bytes()
    got = slim_decoder(stage / DECODER_FILE)
    assert got["nodes_after"] == got["nodes_before"] and got["applied"] == {} and "MultiHeadAttention" in got["reason"]
    assert (stage / DECODER_FILE).read_bytes() == before


def test_a_graph_shape_inference_cannot_finish_is_left_as_it_is_and_nothing_is_written_beside_it(tmp_path, monkeypatch):
    """An op the shape inference does not know leaves tensors unknown: no chain through them is rewritten, and the
    working directory gets no partial model (ORT's ``infer_shapes`` writes one there before it raises)."""
    from onnx import TensorProto, helper, numpy_helper

    monkeypatch.chdir(tmp_path)
    split = numpy_helper.from_array(np.array([2, 3, 2, 2], np.int64), "split")
    back = numpy_helper.from_array(np.array([2, 3, 4], np.int64), "back")
    graph = helper.make_graph(
        [helper.make_node("Foo", ["x"], ["u"], domain="example.unknown"),
         helper.make_node("Reshape", ["u", "split"], ["a"]), helper.make_node("Reshape", ["a", "back"], ["b"]),
         helper.make_node("Identity", ["b"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [split, back])
    path = tmp_path / "g.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                       helper.make_opsetid("example.unknown", 1)]), str(path))
    got = drop_identity_layouts(path)
    assert got["chains"] == 0 and _ops(path)["Reshape"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.onnx"]


def _encoder_outputs(path, ids, mask) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, {"input_ids": ids, "attention_mask": mask}), strict=True))


def test_the_encoder_bias_beyond_its_clip_distance_equals_the_fused_graphs(tmp_path):
    """A T5 whose buckets stop growing at 6 positions (relative_attention_max_distance 6), on padded sources of 30
    tokens: the clipped table gives every output bit for bit as the fused graph without the rewrites."""
    from tiny_seq2seq import build_seq2seq

    from xformopt.passes.export.dynamo import onnxscript_fusions

    src = build_seq2seq(tmp_path / "hf", "t5", seed=3)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "relative_attention_max_distance": 6}))
    stage = _export(src, tmp_path / "onnx")
    record = run_pass("fuse", make_ctx(src, ["w1 w2", "w1 w2 w3", "w4 w5 w6 w7"]), stage, tmp_path / "fused", select="all")
    assert record["slim"][ENCODER_FILE]["applied"]["attention_bias"] == 3, record["slim"]
    onnxscript_fusions(stage / ENCODER_FILE, tmp_path / "unslimmed.onnx")
    rng = np.random.default_rng(0)
    ids = rng.integers(3, 20, (2, 30)).astype(np.int64)
    mask = np.ones_like(ids)
    mask[1, 21:] = 0
    want = _encoder_outputs(tmp_path / "unslimmed.onnx", ids, mask)
    got = _encoder_outputs(tmp_path / "fused" / ENCODER_FILE, ids, mask)
    assert want.keys() == got.keys() and all(np.array_equal(want[k], got[k]) for k in want)


def test_an_encoder_graph_whose_outputs_would_change_is_left_as_it_is(fused, tmp_path, monkeypatch):
    """The whole-graph check is the last word: where it finds a differing output, nothing is written."""
    from xformopt.seq2seq import slim_encoder

    _, unslimmed, *_ = fused
    path = tmp_path / ENCODER_FILE
    shutil.copy(unslimmed / ENCODER_FILE, path)
    before = path.read_bytes()
    monkeypatch.setattr(slim_encoder, "_differing_outputs", lambda original, model: ["logits"])
    got = slim_encoder.slim_encoder(path)
    assert got["nodes_after"] == got["nodes_before"] and "logits" in got["reason"] and path.read_bytes() == before


def test_the_search_graph_drops_padding_masks_and_says_so(fused):
    """generate.onnx decodes one unpadded row: its subgraphs lose the padding masks (the encoder's and both cross-
    attentions'), and attention over 3-D inputs is ONNX Attention where this ONNX Runtime runs it (not a step's
    cross-attention, which reads the cache as [batch, heads, length, head])."""
    from xformopt.seq2seq.search_rewrites import runs_onnx_attention

    _, _, record, *_ = fused
    search = record["search_graph"]
    assert search["file"] and search["rewrites"]["padding_masks"] == 4 and search["rewrites"]["agreed"], search
    # the encoder's 2 self-attentions, the first step's self- and cross-attention in 2 layers, a step's 2 self-attentions
    assert search["rewrites"]["onnx_attention"] == (8 if runs_onnx_attention() else 0), search


def test_a_padded_source_decodes_in_the_python_loop(fused, caplog):
    """The search graph's masks are gone: a row with padding runs the Python loop, with the same tokens as a
    Python loop over the same padded row, and says why."""
    import logging

    slimmed, _, _, tokenizer, sources, _ = fused
    settings = GenerationSettings.from_model_dir(slimmed).with_(max_new_tokens=MAX_NEW, num_beams=4)
    enc = tokenizer([sources[0]], padding="max_length", max_length=24, return_tensors="np")
    assert not enc["attention_mask"].all()
    op = OrtSeq2Seq(slimmed, threads=1, search=open_search_graph(slimmed, 1))
    with caplog.at_level(logging.INFO, logger="xformopt"):
        rows = generate(op, enc["input_ids"], enc["attention_mask"], settings)
    assert "a padded source" in caplog.text
    assert rows == generate(OrtSeq2Seq(slimmed, threads=1), enc["input_ids"], enc["attention_mask"], settings)


@pytest.mark.parametrize("failure", ["other tokens", "refused by ORT"])
def test_a_search_graph_whose_attention_kernel_fails_is_built_without_it(fused, tmp_path, monkeypatch, failure):
    """Where the graph with ONNX Attention gives other tokens than the Python loop, or ORT cannot run it, the one
    without it is checked and kept; the record lists both tries."""
    from xformopt.seq2seq import search_graph
    from xformopt.seq2seq.search_rewrites import runs_onnx_attention

    if not runs_onnx_attention():
        pytest.skip("this ONNX Runtime has no Attention (opset 23) CPU kernel: no graph with it to refuse")
    slimmed, _, _, tokenizer, sources, _ = fused
    folder = tmp_path / "stage"
    shutil.copytree(slimmed, folder)
    real = search_graph._disagreement

    def picky(folder, texts, tokenizer, settings, threads):
        model = onnx.load(str(folder / search_graph.GENERATE_FILE))
        uses = any(n.op_type == "Attention" for a in model.graph.node[0].attribute if a.g.node for n in a.g.node)
        if uses and failure == "refused by ORT":
            raise RuntimeError("[ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : Could not find an implementation (made up)")
        return "tokens differ (made up)" if uses else real(folder, texts, tokenizer, settings, threads)

    monkeypatch.setattr(search_graph, "_disagreement", picky)
    record = search_graph.write_search_graph(folder, sources[:4], tokenizer, 1)
    assert record["file"] and [t["onnx_attention"] for t in record["tried"]] == [8, 0], record
    assert [t["agreed"] for t in record["tried"]] == [False, True] and record["rewrites"]["onnx_attention"] == 0
