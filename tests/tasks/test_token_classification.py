"""token-classification: the data formats, the word-level predictions, the metrics (seqeval), an
end-to-end optimize of a tiny trained BertForTokenClassification, and running the artifact in a transformers pipeline."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import numpy as np
import pytest
from helpers import (
    _bert_config,
    _save,
    check_bench_report_and_gate,
    error_lines,
    run_cli,
)

from xformopt import sources, tasks
from xformopt.errors import InputError
from xformopt.tasks import token_classification as tc
from xformopt.tasks.token_data import load_tagged

LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
LABEL2ID = {n: i for i, n in enumerate(LABELS)}
# Entity words: names (some split into several WordPiece sub-tokens by the tiny vocabulary) and places.
PEOPLE = ["anna", "bob", "zelda", "quentin", "maria"]
PLACES = ["paris", "zurich", "oslo", "kyoto"]
FILLER = ["the", "movie", "was", "good", "and", "is", "not", "very", "bad", "it", "this", "to", "of", "a", "in"]


def make_sentences(n: int, seed: int) -> list[tuple[list[str], list[str]]]:
    """Random filler with one or two entities per sentence; a two-word name is B-PER I-PER."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        words, tags = [], []
        for _ in range(rng.randint(2, 5)):
            words.append(rng.choice(FILLER))
            tags.append("O")
        for _ in range(rng.randint(1, 2)):
            at = rng.randint(0, len(words))
            if rng.random() < 0.5:
                span = [rng.choice(PEOPLE)] + ([rng.choice(PEOPLE)] if rng.random() < 0.5 else [])
                kind = "PER"
            else:
                span, kind = [rng.choice(PLACES)], "LOC"
            span_tags = [f"B-{kind}"] + [f"I-{kind}"] * (len(span) - 1)
            words[at:at] = span
            tags[at:at] = span_tags
        rows.append((words, tags))
    return rows


@pytest.fixture(scope="module")
def tiny_ner(tmp_path_factory, tokenizer_dir) -> Path:
    """A tiny BertForTokenClassification trained for a few steps on make_sentences (non-trivial F1)."""
    import torch
    from transformers import AutoTokenizer, BertForTokenClassification

    torch.manual_seed(0)
    config = _bert_config(tokenizer_dir, num_labels=len(LABELS), id2label=dict(enumerate(LABELS)), label2id=LABEL2ID)
    model = BertForTokenClassification(config)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    train = make_sentences(256, seed=1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for step in range(120):
        batch = train[(step * 16) % len(train):][:16]
        enc = tokenizer([w for w, _ in batch], is_split_into_words=True, padding=True, return_tensors="pt")
        labels = torch.full(enc["input_ids"].shape, -100)
        for b, (_, tags) in enumerate(batch):
            positions, words = tc.first_subtokens(enc.word_ids(b))
            labels[b, positions] = torch.tensor([LABEL2ID[tags[w]] for w in words])
        loss = model(**enc, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    return _save(model, tokenizer_dir, tmp_path_factory.mktemp("tiny-bert-ner"))


@pytest.fixture(scope="module")
def heldout_rows():
    return make_sentences(40, seed=7)


def write_conll(path: Path, rows, docstart: bool = True) -> Path:
    lines = ["-DOCSTART- -X- -X- O", ""] if docstart else []
    for words, tags in rows:
        lines += [f"{w} NN B-NP {t}" for w, t in zip(words, tags)] + [""]
    path.write_text("\n".join(lines) + "\n")
    return path


def write_jsonl(path: Path, rows, tokens="tokens", tags="ner_tags", ids=False) -> Path:
    with path.open("w") as f:
        for words, t in rows:
            f.write(json.dumps({tokens: words, tags: [LABEL2ID[x] for x in t] if ids else t}) + "\n")
    return path


@pytest.fixture(scope="module")
def heldout_conll(tmp_path_factory, heldout_rows) -> Path:
    return write_conll(tmp_path_factory.mktemp("ner-data") / "heldout.conll", heldout_rows)


# --------------------------------------------------------------------------- data


def test_detected_from_the_config(tiny_ner):
    spec = sources.resolve(str(tiny_ner))
    assert spec.task == "token-classification"
    assert spec.task_def is tasks.get("token-classification")
    assert spec.label2id == LABEL2ID


def test_formats_read_the_same_rows(tmp_path, heldout_rows):
    import datasets

    conll = load_tagged(write_conll(tmp_path / "a.conll", heldout_rows), label2id=LABEL2ID)
    jsonl = load_tagged(write_jsonl(tmp_path / "a.jsonl", heldout_rows), label2id=LABEL2ID)
    ids = load_tagged(write_jsonl(tmp_path / "b.jsonl", heldout_rows, "words", "tags", ids=True), label2id=LABEL2ID)
    with (tmp_path / "a.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["tokens", "pos_tags"])
        writer.writerows([json.dumps(w), json.dumps(t)] for w, t in heldout_rows)
    table = load_tagged(tmp_path / "a.csv", label2id=LABEL2ID)
    # A datasets ClassLabel sequence in another id order than the model's: mapped by name.
    names = list(reversed(LABELS))
    features = datasets.Features({"tokens": datasets.Sequence(datasets.Value("string")),
                                  "ner_tags": datasets.Sequence(datasets.ClassLabel(names=names))})
    ds = datasets.Dataset.from_dict({"tokens": [w for w, _ in heldout_rows],
                                     "ner_tags": [[names.index(x) for x in t] for _, t in heldout_rows]}, features=features)
    ds.save_to_disk(str(tmp_path / "ds"))
    saved = load_tagged(tmp_path / "ds", label2id=LABEL2ID)
    expected_tags = [[LABEL2ID[x] for x in t] for _, t in heldout_rows]
    for data in (conll, jsonl, ids, table, saved):
        assert data.extra["words"] == [w for w, _ in heldout_rows]
        assert data.extra["tags"] == expected_tags
        assert data.texts[0] == " ".join(heldout_rows[0][0])
        assert data.label_names == dict(enumerate(LABELS))
        assert len(data) == len(heldout_rows)


def test_conll_details(tmp_path):
    path = tmp_path / "x.iob"
    path.write_text("-DOCSTART- O\n\nEU\tB-ORG\nrejects O\n\n\n\nPeter B-PER\nBlackburn I-PER\n")
    data = load_tagged(path, label2id={"O": 0, "B-PER": 1, "I-PER": 2, "B-ORG": 3})
    assert data.extra["words"] == [["EU", "rejects"], ["Peter", "Blackburn"]]
    assert data.extra["tags"] == [[3, 0], [1, 2]]
    untagged = tmp_path / "plain.txt"
    untagged.write_text("EU\nrejects\n\nPeter\n")
    plain = load_tagged(untagged, label2id=LABEL2ID)
    assert plain.extra["words"] == [["EU", "rejects"], ["Peter"]] and "tags" not in plain.extra
    sample = load_tagged(path, label2id={"O": 0, "B-PER": 1, "I-PER": 2, "B-ORG": 3}, limit=1, seed=0)
    assert len(sample) == 1 and len(sample.extra["tags"]) == 1


def test_text_only_table_is_untagged_words(heldout_file):
    data = tasks.get("token-classification").load(heldout_file, label2id=LABEL2ID, limit=None, seed=0)
    assert "tags" not in data.extra
    assert data.extra["words"][0] == data.texts[0].split()


@pytest.mark.parametrize("content, suffix, needle", [
    ('{"tokens": ["anna", "was"], "ner_tags": ["B-PER", "B-MISC"]}\n', ".jsonl", "'B-MISC'"),
    ('{"tokens": ["anna", "was"], "ner_tags": ["B-PER"]}\n', ".jsonl", "2 tokens but 1 tags"),
    ("anna B-PER\nwas O\nhere\n", ".conll", "line 3"),
    ('{"tokens": ["anna"], "ner_tags": [9]}\n', ".jsonl", "tag id 9"),
    ("\n\n", ".conll", "no sentences"),
    ("", ".jsonl", "no rows"),
    ('tokens,tags\nanna was,O O\n', ".csv", "JSON list"),
])
def test_bad_data_is_one_line(tmp_path, content, suffix, needle):
    path = tmp_path / f"bad{suffix}"
    path.write_text(content)
    with pytest.raises(InputError) as info:
        load_tagged(path, label2id=LABEL2ID)
    message = str(info.value)
    assert needle in message and "\n" not in message


def test_bad_data_exits_2_through_the_cli(tmp_path, tiny_ner, capsys):
    for name, content, needle in (
        ("tag.jsonl", '{"tokens": ["anna"], "ner_tags": ["B-ORG"]}\n', "'B-ORG' is not a label of the model (known: 0=O, 1=B-PER"),
        ("len.jsonl", '{"tokens": ["anna", "x"], "ner_tags": ["B-PER"]}\n', "2 tokens but 1 tags"),
        ("empty.conll", "", "no sentences"),
    ):
        (tmp_path / name).write_text(content)
        code, _, err = run_cli(["optimize", tiny_ner, "-o", tmp_path / f"out-{name}", "--data", tmp_path / name], capsys)
        lines = error_lines(err)
        assert code == 2, err
        assert len(lines) == 1 and needle in lines[0], err


# --------------------------------------------------------------------------- metrics


def test_entity_scores_agree_with_seqeval():
    from seqeval.metrics import f1_score, precision_score, recall_score

    # seqeval's documented example: F1 0.5 (the MISC span is one word too long).
    y_true = [["O", "O", "O", "B-MISC", "I-MISC", "I-MISC", "O"], ["B-PER", "I-PER", "O"]]
    y_pred = [["O", "O", "B-MISC", "I-MISC", "I-MISC", "I-MISC", "O"], ["B-PER", "I-PER", "O"]]
    names = ["O", "B-MISC", "I-MISC", "B-PER", "I-PER"]
    got = tc.entity_scores(y_true, y_pred, names)
    assert got["entity_f1"]["value"] == pytest.approx(0.5)
    assert got["entity_f1"]["n"] == 2 and got["entity_f1"]["entities"] == 2 and got["entity_f1"]["scheme"] == "IOB2"
    # Random sequences, I- without B- included (conlleval starts an entity there): same as seqeval.
    rng = random.Random(0)
    for _ in range(20):
        gold = [[rng.choice(LABELS) for _ in range(rng.randint(1, 8))] for _ in range(rng.randint(1, 10))]
        pred = [[rng.choice(LABELS) for _ in s] for s in gold]
        ours = tc.entity_scores(gold, pred, LABELS)
        assert ours["entity_f1"]["value"] == pytest.approx(f1_score(gold, pred))
        assert ours["entity_precision"]["value"] == pytest.approx(precision_score(gold, pred))
        assert ours["entity_recall"]["value"] == pytest.approx(recall_score(gold, pred))
        lo, hi = ours["entity_f1"]["ci95"]
        assert 0 <= lo <= hi <= 1


def test_pos_tags_are_scored_per_word():
    names = ["NOUN", "VERB", "DET"]
    gold = [["DET", "NOUN", "VERB"], ["NOUN", "NOUN"]]
    pred = [["DET", "VERB", "VERB"], ["NOUN", "NOUN"]]
    assert tc.scheme(names) == "word" and tc.scheme(LABELS) == "IOB2"
    got = tc.entity_scores(gold, pred, names)
    assert got["entity_f1"]["scheme"] == "word"
    assert got["entity_f1"]["value"] == pytest.approx(4 / 5)  # = token accuracy when no word is O


def logits_for(tags: list[list[int]], width: int, num_labels: int = len(LABELS)) -> np.ndarray:
    out = np.full((len(tags), width, num_labels), np.nan, dtype=np.float32)
    for i, row in enumerate(tags):
        out[i, : len(row)] = -1.0
        out[i, np.arange(len(row)), row] = 1.0
    return out


def test_score_and_agreement_on_hand_made_outputs():
    from xformopt.data import TextDataset

    words = [["anna", "was", "in", "paris"], ["bob"]]
    gold = [[1, 0, 0, 3], [1]]
    data = TextDataset(texts=[" ".join(w) for w in words], text_pairs=None, labels=None,
                       label_names=dict(enumerate(LABELS)), source="hand", row_ids=[0, 1],
                       extra={"words": words, "tags": gold})
    task = tasks.get("token-classification")
    baseline = logits_for(gold, 4)
    wrong = logits_for([[1, 0, 0, 0], [1]], 4)  # paris missed
    wrong[1, 0] = np.nan  # bob never seen (as if truncated): predicted O, counted
    metrics = task.score(wrong, baseline, data)
    assert metrics["token_accuracy"]["value"] == pytest.approx(3 / 5)
    assert metrics["token_accuracy"]["words_without_logits"] == 1
    assert metrics["entity_recall"]["value"] == pytest.approx(1 / 3)
    assert metrics["entity_precision"]["value"] == pytest.approx(1.0)
    assert metrics["agreement_with_baseline"]["value"] == pytest.approx(3 / 4)  # bob has no logits: not compared
    assert set(task.score(baseline, baseline, data)) >= {"entity_f1", "token_accuracy", "agreement_with_baseline"}
    assert task.score(baseline, baseline, data)["entity_f1"]["value"] == 1.0
    rows = task.agreement(wrong, baseline)
    assert rows.tolist() == [0.75, 1.0]  # NaN pads and unseen words ignored
    assert task.budget_points(wrong, baseline, data)[0] == "entity_f1"
    untagged = TextDataset(texts=data.texts, text_pairs=None, labels=None, label_names=data.label_names,
                           source="hand", row_ids=[0, 1], extra={"words": words})
    assert set(task.score(wrong, baseline, untagged)) == {"agreement_with_baseline"}
    assert task.budget_points(wrong, baseline, untagged) == ("agreement_with_float", pytest.approx(100 * 0.875))


# --------------------------------------------------------------------------- predicting


def test_predict_takes_the_first_subtoken_of_each_word(tiny_ner, heldout_conll):
    import torch
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    from xformopt.runtime.encoder import TorchPredictor

    spec = sources.resolve(str(tiny_ner))
    data = spec.task_def.load(heldout_conll, label2id=spec.label2id, limit=None, seed=0)
    out = TorchPredictor(spec).predict_data(data, batch_size=7)
    width = max(len(w) for w in data.extra["words"])
    assert out.shape == (len(data), width, len(LABELS)) and out.dtype == np.float32
    model = AutoModelForTokenClassification.from_pretrained(tiny_ner).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_ner)
    for i in (0, 5, 17):
        words = data.extra["words"][i]
        enc = tokenizer(words, is_split_into_words=True, return_tensors="pt")
        with torch.inference_mode():
            logits = model(**enc).logits[0].numpy()
        first = [enc.word_ids().index(w) for w in range(len(words))]
        np.testing.assert_allclose(out[i, : len(words)], logits[first], atol=1e-5)
        assert np.isnan(out[i, len(words):]).all()
    metrics = spec.task_def.score(out, out, data)
    assert metrics["entity_f1"]["value"] > 0.5, metrics  # the few training steps learned the entities
    assert metrics["agreement_with_baseline"]["value"] == 1.0


def test_words_past_truncation_have_no_logits(tiny_ner, tmp_path):
    from xformopt.runtime.encoder import TorchPredictor

    spec = sources.resolve(str(tiny_ner))
    long = (["zelda", "was"] * 80, ["B-PER", "O"] * 80)  # 160 words, far over the 128 positions
    data = spec.task_def.load(write_jsonl(tmp_path / "long.jsonl", [long, make_sentences(1, 3)[0]]),
                              label2id=spec.label2id, limit=None, seed=0)
    out = TorchPredictor(spec).predict_data(data)
    seen = tc._has_logits(out[0])
    assert 0 < seen.sum() < 160 and not seen[-1]
    metrics = spec.task_def.score(out, out, data)
    assert metrics["token_accuracy"]["words_without_logits"] == 160 - int(seen.sum())


# --------------------------------------------------------------------------- end to end


RECIPE = ("name: tiny-ner\ntarget: auto\npasses:\n  - export\n  - fuse:\n      select: all\n  - quantize\n"
          "evaluation:\n  latency_rounds: 3\n  warmup: 1\n  repeats: 1\n")


def test_optimize_writes_an_int8_artifact_that_a_pipeline_runs(tmp_path, tiny_ner, heldout_conll, heldout_rows,
                                                             capsys, monkeypatch):
    from helpers import onnx_op_counts

    (tmp_path / "tiny.yaml").write_text(RECIPE)
    out = tmp_path / "out"
    code, _, err = run_cli(["optimize", tiny_ner, "-o", out, "--data", heldout_conll, "--recipe", tmp_path / "tiny.yaml"],
                           capsys)
    assert code == 0, err
    report = json.loads((out / "report.json").read_text())
    assert report["headline_metric"] == "entity_f1"
    assert [s["name"] for s in report["stages"]][-1] == "quantize"
    ops = onnx_op_counts(out / "model.onnx")
    assert ops.get("MatMulInteger", 0) + ops.get("QAttention", 0) + ops.get("DynamicQuantizeMatMul", 0) > 0, ops
    for stage in report["stages"]:
        for metric in ("entity_f1", "entity_precision", "entity_recall", "token_accuracy", "agreement_with_baseline"):
            assert {"value", "n", "ci95"} <= set(stage["metrics"][metric]), (stage["name"], metric)
        assert stage["metrics"]["entity_f1"]["n"] == len(heldout_rows)
    int8 = report["stages"][-1]["metrics"]
    assert int8["agreement_with_baseline"]["value"] >= 0.9
    assert int8["entity_f1"]["value"] > 0.5
    ref = np.load(out / "reference" / "baseline_outputs.npy", allow_pickle=False)
    assert ref.shape == (len(heldout_rows), max(len(w) for w, _ in heldout_rows), len(LABELS))
    assert np.isnan(ref).any() and not np.isnan(ref[:, 0]).any()  # NaN only past each row's words
    check_runs_in_a_pipeline(out, tiny_ner)
    check_bench_report_and_gate(out, capsys)


def check_runs_in_a_pipeline(artifact: Path, tiny_ner: Path) -> None:
    import torch
    from transformers import AutoModelForTokenClassification, AutoTokenizer, pipeline

    from xformopt.clients.transformers_pipeline import OnnxPipelineModel

    model = OnnxPipelineModel(artifact)
    tokenizer = AutoTokenizer.from_pretrained(artifact)
    enc = tokenizer(["anna was in paris"], return_tensors="pt")
    with torch.inference_mode():
        fp32 = AutoModelForTokenClassification.from_pretrained(tiny_ner).eval()(**enc).logits
    int8 = model(**enc).logits
    assert int8.shape == fp32.shape
    assert (int8.argmax(-1) == fp32.argmax(-1)).float().mean() >= 0.8
    # aggregation "first": the first sub-token tags the word, as the model was trained and is scored
    tagger = pipeline("token-classification", model=model, tokenizer=tokenizer, aggregation_strategy="first")
    found = tagger("anna was in paris")
    assert any(e["word"] == "paris" and e["entity_group"] == "LOC" for e in found), found
    assert any(e["word"] == "anna" and e["entity_group"] == "PER" for e in found), found


def test_optimize_without_tags_reports_agreement(tmp_path, tiny_ner, capsys, monkeypatch):
    """The vendored sentiment split (text only): whitespace words, untagged; agreement is the metric."""
    (tmp_path / "tiny.yaml").write_text(RECIPE.replace("repeats: 1", "repeats: 1\n  limit: 12"))
    out = tmp_path / "out"
    code, _, err = run_cli(["optimize", tiny_ner, "-o", out, "--recipe", tmp_path / "tiny.yaml"], capsys)
    assert code == 0, err
    report = json.loads((out / "report.json").read_text())
    for stage in report["stages"]:
        assert set(stage["metrics"]) == {"agreement_with_baseline"}
    assert report["stages"][-1]["metrics"]["agreement_with_baseline"]["value"] >= 0.9


def test_finish_pads_subtoken_outputs_so_plain_text_batches_stack(tiny_ner):
    """Plain-text prediction (export parity, the INT8 cosine on sample texts) stacks batches of different
    lengths; the padding is zeros, so row cosine and ``agreement`` see only real tokens."""
    from xformopt.runtime.encoder import TorchPredictor
    from xformopt.scoring.metrics import row_cosine

    spec = sources.resolve(str(tiny_ner))
    predictor = TorchPredictor(spec)
    texts = ["anna", "anna was in paris with bob", "the movie was good"]
    out = predictor.predict(texts, batch_size=2)
    assert out.shape == (3, tc.TOKEN_WIDTH, len(LABELS))
    lengths = [len(predictor.tokenizer(t)["input_ids"]) for t in texts]
    assert tc._has_logits(out).sum(1).tolist() == lengths  # every real token, no padding
    alone = predictor(["anna"])
    np.testing.assert_allclose(out[0], alone[0], atol=1e-5)
    assert row_cosine(out, out) == pytest.approx(1.0)
    noisy = out + np.where(tc._has_logits(out)[..., None], 0.01, 0.0).astype(np.float32)
    assert spec.task_def.agreement(noisy, out).tolist() == [1.0, 1.0, 1.0]


def test_static_int8_and_the_accuracy_budget_read_tagged_rows(tmp_path, tiny_ner, heldout_conll, capsys):
    """Calibration and the budget read CoNLL rows; the budget holds entity F1 points."""
    (tmp_path / "static.yaml").write_text(
        "name: ner-static\ntarget: avx512_vnni\npasses:\n  - export\n  - fuse: {select: all}\n"
        f"  - quantize: {{mode: static, calibration_data: {heldout_conll}, calibration_limit: 16,\n"
        f"                budget_data: {heldout_conll}, max_accuracy_drop: 50, min_agreement: 0.5}}\n"
        "evaluation:\n  latency_rounds: 3\n  warmup: 1\n  repeats: 1\n")
    out = tmp_path / "out"
    code, _, err = run_cli(["optimize", tiny_ner, "-o", out, "--data", heldout_conll, "--recipe", tmp_path / "static.yaml"],
                           capsys)
    assert code == 0, err
    record = json.loads((out / "manifest.json").read_text())["passes"][-1]["record"]
    assert record["mode"] == "static" and record["calibration"]["rows"] == 16
    assert record["budget"]["metric"] == "entity_f1" and record["budget_met"] is True
    assert record["agreement"]["measure"] == "word tag agreement"
