"""The decode loop's exactness (issue 55) on a tiny T5 trained in code, over the 100 held-out sources of the
vendored reverse split: the float graphs give transformers' ``generate`` tokens (greedy and 4 beams), and the
INT8 graphs give the same tokens through IO-bound steps as through ``run``'s."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import make_ctx, run_pass
from test_seq2seq import _cut, _export, _hf_generate
from tiny_seq2seq import build_seq2seq

from xformopt.resources import word_seq2seq_path
from xformopt.seq2seq.generate import GenerationSettings, generate, top_k
from xformopt.seq2seq.runner import OrtSeq2Seq

pytestmark = pytest.mark.filterwarnings("ignore")
BATCH = 10  # sources per call, padded: the held-out set in ten calls
MAX_NEW = 16


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny T5 trained 300 steps (seeded), its float export and dynamic INT8 of it."""
    root = tmp_path_factory.mktemp("t5-loop")
    src = build_seq2seq(root / "hf", "t5", train_steps=300)
    stage = _export(src, root / "onnx")
    sources = [json.loads(line)["source"] for line in word_seq2seq_path("reverse", "test").read_text().splitlines()]
    run_pass("quantize", make_ctx(src, sources[:8]), stage, root / "int8", outlier_rules=False)
    return src, stage, root / "int8", sources


def _batches(src, sources):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(src)
    for i in range(0, len(sources), BATCH):
        enc = tokenizer(sources[i:i + BATCH], padding=True, return_tensors="np")
        yield enc["input_ids"], enc["attention_mask"]


def _rows(runner, src, sources, settings) -> list[list[int]]:
    return [row for ids, mask in _batches(src, sources) for row in _cut(generate(runner, ids, mask, settings))]


@pytest.mark.parametrize("beams", [1, 4])
def test_float_graphs_give_transformers_tokens_on_every_held_out_source(trained, beams):
    src, stage, _, sources = trained
    settings = GenerationSettings.from_model_dir(stage).with_(max_new_tokens=MAX_NEW, num_beams=beams)
    ours = _rows(OrtSeq2Seq(stage, threads=1), src, sources, settings)
    theirs = [row for ids, mask in _batches(src, sources)
              for row in _hf_generate(src, {"input_ids": ids, "attention_mask": mask}, max_new_tokens=MAX_NEW,
                                      num_beams=beams)]
    assert len(ours) == len(sources) == 100
    assert ours == theirs


@pytest.mark.parametrize("beams", [1, 4])
def test_int8_bound_steps_give_the_unbound_steps_tokens(trained, beams):
    """IO-bound steps (``bind_io=True``) against ``run``'s: at least 99 of the 100 held-out rows identical (a row
    may differ only where two scores tie within rounding; both run the same kernels, so all 100 are expected).
    The search against the branch point's: benchmarks/seq2seq_loop_exactness.py."""
    src, _, int8, sources = trained
    settings = GenerationSettings.from_model_dir(int8).with_(max_new_tokens=MAX_NEW, num_beams=beams)
    bound = _rows(OrtSeq2Seq(int8, threads=1, bind_io=True), src, sources, settings)
    previous = _rows(OrtSeq2Seq(int8, threads=1, bind_io=False), src, sources, settings)
    differing = [(i, a, b) for i, (a, b) in enumerate(zip(bound, previous)) if a != b]
    assert len(bound) == 100 and len(differing) <= 1, differing


def test_top_k_is_a_stable_descending_sort_cut_at_k():
    """Beam search's ranking: the same indices, in the same order, as a stable argsort, ties and -inf included."""
    rng = np.random.default_rng(0)
    for _ in range(300):
        rows, n, k = int(rng.integers(1, 4)), int(rng.integers(1, 300)), int(rng.integers(1, 12))
        scores = rng.integers(-3, 3, size=(rows, n)).astype(np.float64)
        scores[rng.random(scores.shape) < 0.3] = -np.inf
        assert (top_k(scores, k) == np.argsort(-scores, axis=1, kind="stable")[:, :k]).all()
