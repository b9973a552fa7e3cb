"""Per-token INT8 activation scales (xformopt.runtime.per_token_int8): a served row's answer no longer
depends on its batch mates, and sessions over the rewrite compute what the unfused graph computes."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(scope="module")
def int8_classifier(tmp_path_factory, tiny_classifier, exported_classifier, sample_texts):
    from conftest import make_ctx, run_pass

    dst = tmp_path_factory.mktemp("int8") / "q"
    run_pass("quantize", make_ctx(tiny_classifier, sample_texts), exported_classifier[0], dst)
    return dst


def test_per_token_scales_make_rows_independent_of_their_batch(int8_classifier, sample_texts):
    from xformopt.runtime.per_token_int8 import has_dynamic_int8
    from xformopt.runtime.predictor import load_predictor

    assert has_dynamic_int8(int8_classifier / "model.onnx")
    texts = sample_texts[:24]
    for scales, independent in (("per-token", True), ("per-tensor", False)):
        predictor = load_predictor(int8_classifier, threads=1, int8_scales=scales)
        rows = [p.rows[0] for p in predictor.prepare(texts)]
        alone = np.stack([predictor.run_rows([r])[0] for r in rows])
        batched = np.stack(predictor.run_rows(rows))
        assert np.allclose(alone, batched, atol=1e-5) == independent, scales
    before = (int8_classifier / "model.onnx").read_bytes()
    load_predictor(int8_classifier, threads=1)
    assert (int8_classifier / "model.onnx").read_bytes() == before  # the artifact is never rewritten


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
