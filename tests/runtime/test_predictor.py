"""The task-level predictor (xformopt.runtime.predictor): answers match transformers' pipelines on the
same ONNX graph (xformopt.clients.transformers_pipeline), the task's own evaluation outputs, and stay the same whatever
the batch size."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from xformopt.errors import InputError
from xformopt.runtime.predictor import load_predictor

TEXTS = ["a wonderful , moving film", "dull and far too long .", "the plot goes nowhere but the actors are great",
         "not bad", "one of the worst films of the year , really bad acting and a silly story"]


def _ort_pipeline(task: str, artifact, **kwargs):
    from transformers import AutoTokenizer, pipeline

    from xformopt.clients.transformers_pipeline import OnnxPipelineModel

    model = OnnxPipelineModel(artifact, task)
    return pipeline(task, model=model, tokenizer=AutoTokenizer.from_pretrained(artifact), **kwargs)


def test_classification_matches_the_pipeline_on_the_same_graph(served_classifier):
    predictor = load_predictor(served_classifier)
    assert predictor.task == "text-classification"
    got = predictor.predict(TEXTS, batch_size=2)
    want = _ort_pipeline("text-classification", served_classifier, top_k=None)(TEXTS)
    for g, w in zip(got, want):
        assert [x["label"] for x in g] == [x["label"] for x in w]
        assert [x["score"] for x in g] == pytest.approx([x["score"] for x in w], abs=1e-5)
        assert g[0]["score"] >= g[1]["score"] and sum(x["score"] for x in g) == pytest.approx(1.0)
    one = predictor.predict(TEXTS[0])  # one input, one answer
    assert [x["label"] for x in one] == [x["label"] for x in got[0]]
    assert [x["score"] for x in one] == pytest.approx([x["score"] for x in got[0]], abs=1e-6)
    raw = predictor.predict(TEXTS[:1], raw_scores=True)[0]
    logits = predictor.runner(TEXTS[:1])[0]
    assert sorted(x["score"] for x in raw) == pytest.approx(sorted(logits.tolist()), abs=1e-6)


def test_classification_takes_pairs_as_the_tokenizer_pairs_them(served_classifier):
    predictor = load_predictor(served_classifier)
    pair = (TEXTS[0], TEXTS[1])
    got = predictor.predict([pair, TEXTS[2]])
    logits = predictor.runner([pair[0]], [pair[1]])[0]
    probs = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    assert got[0][0]["score"] == pytest.approx(float(probs.max()), abs=1e-6)
    assert predictor.predict(pair)[0]["score"] == pytest.approx(got[0][0]["score"])  # a lone pair is one input
    explicit = predictor.predict([TEXTS[0], TEXTS[2]], pairs=[TEXTS[1], TEXTS[3]])
    assert explicit[0][0]["score"] == pytest.approx(got[0][0]["score"])
    assert predictor.predict(TEXTS[0], pairs=TEXTS[1])[0]["score"] == pytest.approx(got[0][0]["score"])
    with pytest.raises(InputError, match="input 0 is neither a text nor"):
        predictor.predict([[1, 2]])
    with pytest.raises(InputError, match="2 texts but 1 pairs"):
        predictor.predict(TEXTS[:2], pairs=TEXTS[:1])


def test_a_list_of_two_texts_is_two_inputs_not_a_pair(served_classifier):
    """TEI reads ["a", "b"] as one pair; in Python a list is always a batch (pairs are tuples)."""
    predictor = load_predictor(served_classifier)
    two = predictor.predict([TEXTS[0], TEXTS[1]])
    assert len(two) == 2 and all(isinstance(answer, list) for answer in two)
    for text, answer in zip(TEXTS[:2], two):
        assert answer == predictor.predict(text)
    assert two != [predictor.predict((TEXTS[0], TEXTS[1]))]
    with pytest.raises(InputError, match="pass a pair as a tuple"):
        predictor.predict([[TEXTS[0], TEXTS[1]]])


def test_embeddings_pool_and_normalize_as_the_sentence_transformers_modules_say(served_embedder):
    from xformopt.scoring.pooling import mean_pool

    predictor = load_predictor(served_embedder)
    assert predictor.task == "feature-extraction" and predictor.max_length == 32
    got = predictor.embed(TEXTS, batch_size=3)
    # the task's own batched masked mean over the padded batch, then L2 (the Normalize module)
    encoded = predictor.runner.tokenize(TEXTS)
    assert encoded["input_ids"].shape[1] <= 32  # max_seq_length from sentence_bert_config.json
    want = mean_pool(predictor.runner.raw_outputs(encoded), encoded["attention_mask"])
    want = want / np.linalg.norm(want, axis=1, keepdims=True)
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    unnormalized = predictor.embed(TEXTS, normalize=False)
    assert not np.allclose(np.linalg.norm(unnormalized, axis=1), 1.0)
    np.testing.assert_allclose(predictor.embed(TEXTS, batch_size=1), got, atol=1e-5)  # batch size changes nothing
    assert predictor.predict(TEXTS[0]) == pytest.approx(got[0].tolist(), abs=1e-6)


def test_embeddings_refuse_an_over_long_text_when_truncation_is_off(served_embedder):
    predictor = load_predictor(served_embedder)
    long_text = " ".join(["film"] * 80)
    cut = predictor.embed([long_text])
    assert cut.shape[0] == 1  # truncated at 32 tokens by default
    with pytest.raises(InputError, match=r"input 0 has 82 tokens, more than the model's 32"):
        predictor.embed([long_text], truncate=False)
    with pytest.raises(InputError, match="not a string"):
        predictor.embed(["ok", 3])
    with pytest.raises(InputError, match=r"truncate='middle': pass True .* \"left\""):
        predictor.embed([long_text], truncate="middle")


def test_truncate_left_keeps_the_end_of_an_over_long_text(served_embedder):
    """``truncate="left"`` (TEI's truncation_direction) embeds the text's last tokens: the same vector as the
    text cut by hand to its tail, and another than the default cut."""
    predictor = load_predictor(served_embedder)
    words = [f"w{i}" for i in range(60)]
    long_text = " ".join(words)
    limit = predictor.max_length
    tail = predictor.tokenizer.convert_tokens_to_string(predictor.tokenizer.tokenize(long_text)[-(limit - 2):])
    left = predictor.embed([long_text], truncate="left")
    np.testing.assert_allclose(left, predictor.embed([tail]), atol=1e-5)
    assert not np.allclose(left, predictor.embed([long_text]), atol=1e-3)
    np.testing.assert_allclose(predictor.embed([long_text], truncate="right"), predictor.embed([long_text]), atol=1e-6)


def test_pooling_modes_are_read_from_the_pooling_config(served_embedder, tmp_path):
    from xformopt.runtime.predictor import Pooling

    copy = tmp_path / "cls"
    shutil.copytree(served_embedder, copy)
    (copy / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
    predictor = load_predictor(copy)
    assert predictor.pooling.mode == "cls" and predictor.pooling.normalize
    states = predictor.runner.raw_outputs(predictor.runner.tokenize(TEXTS[:1]))[0]
    np.testing.assert_allclose(predictor.embed(TEXTS[:1], normalize=False)[0], states[0], atol=1e-5)
    (copy / "modules.json").write_text(json.dumps([{"type": "sentence_transformers.models.Dense", "path": "2"}]))
    with pytest.raises(InputError, match="'Dense' is not in the ONNX graph"):
        Pooling.read(copy)


def test_entities_match_the_pipelines_simple_aggregation(served_tagger):
    predictor = load_predictor(served_tagger)
    assert predictor.task == "token-classification"
    texts = ["john smith lives in paris and loves the film", "a film about london"]
    got = predictor.predict(texts, batch_size=1)
    want = _ort_pipeline("token-classification", served_tagger, aggregation_strategy="simple")(texts)
    assert any(got), "the random tagger tags something (else the comparison is empty)"
    for g, w in zip(got, want):
        assert [(e["entity_group"], e["word"], e["start"], e["end"]) for e in g] == \
            [(e["entity_group"], e["word"], e["start"], e["end"]) for e in w]
        assert [e["score"] for e in g] == pytest.approx([float(e["score"]) for e in w], abs=1e-5)
    assert predictor.predict(texts, batch_size=8) == got


def test_answers_match_the_question_answering_tasks_outputs(served_reader):
    from xformopt.data import TextDataset
    from xformopt.runtime.encoder import OrtPredictor
    from xformopt.tasks import get

    predictor = load_predictor(served_reader)
    assert predictor.task == "question-answering"
    context = " ".join(TEXTS * 40)  # longer than one 128-token window: several windows per question
    items = [{"question": "what is the film about", "context": context}, {"question": "who acts", "context": TEXTS[2]}]
    got = predictor.predict(items, batch_size=3)
    data = TextDataset(texts=[i["question"] for i in items], text_pairs=[i["context"] for i in items], labels=None,
                       label_names=None, source="test", row_ids=[0, 1], extra={"answers": [[], []]})
    want = get("question-answering").predict(OrtPredictor(predictor.spec, served_reader), data)
    assert len(predictor.prepare(items[:1])[0].rows) > 1
    for g, (start, end, score), item in zip(got, want, items):
        assert (g["start"], g["end"]) == (int(start), int(end))
        assert g["score"] == pytest.approx(score, rel=1e-4)
        assert g["answer"] == item["context"][g["start"]:g["end"]]
    assert predictor.predict(items[1]) == got[1]
    with pytest.raises(InputError, match="input 0 needs a non-empty 'question' and 'context'"):
        predictor.predict([{"question": "q"}])


def test_load_refuses_what_it_cannot_serve(tmp_path, served_classifier, tiny_classifier):
    with pytest.raises(InputError, match="artifact not found"):
        load_predictor(tmp_path / "nope")
    with pytest.raises(InputError, match="has no model.onnx"):
        load_predictor(tiny_classifier)
    copy = tmp_path / "no-tokenizer"
    shutil.copytree(served_classifier, copy)
    (copy / "tokenizer.json").unlink()
    with pytest.raises(InputError, match="no tokenizer.json"):
        load_predictor(copy)
    with pytest.raises(InputError, match="embed\\(\\) needs a feature-extraction artifact"):
        load_predictor(served_classifier).embed(["x"])
