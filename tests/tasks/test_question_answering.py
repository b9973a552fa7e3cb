"""question-answering: SQuAD data in every format, windowed span prediction as the pipeline does it,
SQuAD v1.1 scoring, the end-to-end optimize run and the artifact in a transformers pipeline."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from harden_helpers import one_error
from helpers import check_bench_report_and_gate, run_cli
from qa_helpers import make_row, make_rows, train_tiny_qa, write_jsonl

from xformopt import sources, tasks
from xformopt.errors import InputError
from xformopt.tasks import question_answering as qa
from xformopt.tasks.qa_data import load_squad


@pytest.fixture(scope="session")
def tiny_qa(tmp_path_factory, tokenizer_dir) -> Path:
    """A tiny BertForQuestionAnswering trained briefly on synthetic rows (EM well above zero)."""
    return train_tiny_qa(tokenizer_dir, tmp_path_factory.mktemp("tiny-bert-qa"))


@pytest.fixture(scope="session")
def qa_rows() -> list[dict]:
    return make_rows(40, seed=7)


@pytest.fixture(scope="session")
def qa_file(tmp_path_factory, qa_rows) -> Path:
    return write_jsonl(tmp_path_factory.mktemp("qa-data") / "squad.jsonl", qa_rows)


@pytest.fixture(scope="session")
def long_row() -> dict:
    """A context several windows long whose answer is in its last sentence."""
    return make_row(random.Random(11), fillers=45, answer_last=True)


def torch_predictor(model_dir):
    from xformopt.runtime.encoder import TorchPredictor

    return TorchPredictor(sources.resolve(str(model_dir)), model_dir, threads=1)


# --------------------------------------------------------------------------- registry


def test_registered_and_detected(tiny_qa):
    spec = sources.resolve(str(tiny_qa))
    assert spec.task == "question-answering" and spec.task_def is tasks.get("question-answering")
    task = spec.task_def
    assert (task.auto_model, task.export_outputs, task.input_axes, task.headline) == (
        "AutoModelForQuestionAnswering", ("start_logits", "end_logits"), ("batch_size", "sequence_length"), "f1")
    start, end = np.zeros((2, 5)), np.ones((2, 5))
    assert task.combine([start, end]).shape == (2, 5, 2)
    assert (task.combine([start, end])[..., 1] == 1).all()


# --------------------------------------------------------------------------- data


def _nested(rows, impossible_last=False) -> dict:
    paragraphs = []
    for i, r in enumerate(rows):
        answers = [{"text": t, "answer_start": s} for t, s in zip(r["answers"]["text"], r["answers"]["answer_start"])]
        qas = [{"question": r["question"], "id": r["id"], "answers": answers}]
        if impossible_last and i == len(rows) - 1:
            qas[0].update(answers=[], is_impossible=True)
        paragraphs.append({"context": r["context"], "qas": qas})
    return {"version": "1.1", "data": [{"title": "t", "paragraphs": paragraphs}]}


def test_formats_load_the_same_rows(tmp_path, qa_rows):
    rows = qa_rows[:6]
    nested = tmp_path / "dev-v1.1.json"
    nested.write_text(json.dumps(_nested(rows, impossible_last=True), indent=2))
    flat = write_jsonl(tmp_path / "flat.jsonl", rows)
    as_list = write_jsonl(tmp_path / "list.jsonl", [
        {**r, "answers": [{"text": t, "answer_start": s} for t, s in zip(r["answers"]["text"], r["answers"]["answer_start"])]}
        for r in rows])
    array = tmp_path / "array.json"
    array.write_text(json.dumps(rows))
    import datasets

    ds_dir = tmp_path / "squad-ds"
    datasets.DatasetDict({"validation": datasets.Dataset.from_list(rows)}).save_to_disk(str(ds_dir))

    import csv

    table = tmp_path / "rows.csv"
    with open(table, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["id", "question", "context", "answers"])
        writer.writerows([r["id"], r["question"], r["context"], json.dumps(r["answers"])] for r in rows)

    loaded = [load_squad(p) for p in (nested, flat, as_list, array, ds_dir, table)]
    for data in loaded:
        assert data.texts == [r["question"] for r in rows]
        assert data.text_pairs == [r["context"] for r in rows]
        assert data.extra["ids"] == [r["id"] for r in rows]
        assert data.labels is None
    expected = [[{"text": r["answers"]["text"][0], "answer_start": r["answers"]["answer_start"][0]}] for r in rows]
    for data in loaded[1:]:
        assert data.extra["answers"] == expected
    assert loaded[0].extra["answers"] == expected[:-1] + [[]]  # is_impossible: unlabelled
    # through the task (what the pipeline calls), with a limit
    sample = tasks.get("question-answering").load(flat, label2id=None, limit=3, seed=0)
    assert len(sample) == 3 and len(sample.extra["answers"]) == 3


def test_unlabelled_rows_load(tmp_path, qa_rows):
    path = write_jsonl(tmp_path / "q.jsonl", [{"question": r["question"], "context": r["context"]} for r in qa_rows[:3]])
    data = load_squad(path)
    assert data.extra["answers"] == [[], [], []] and data.extra["ids"] == ["0", "1", "2"]


@pytest.mark.parametrize("case, fragment", [
    ("shifted", "is not at answer_start"),
    ("no_context", "no 'context' column"),
    ("empty", "has no questions"),
    ("bad_answers", "answers"),
    ("nested_shifted", "data[0].paragraphs[0].qas[0]"),
])
def test_bad_data_is_one_line_exit_2(tmp_path, capsys, tiny_qa, qa_rows, case, fragment):
    row = dict(qa_rows[0])
    path = tmp_path / "bad.jsonl"
    if case == "shifted":
        row["answers"] = {"text": row["answers"]["text"], "answer_start": [row["answers"]["answer_start"][0] + 1]}
        write_jsonl(path, [qa_rows[1], row])
    elif case == "no_context":
        write_jsonl(path, [{"question": row["question"], "answers": row["answers"]}])
    elif case == "empty":
        path.write_text("")
    elif case == "bad_answers":
        write_jsonl(path, [{**row, "answers": 3}])
    else:
        path = tmp_path / "bad.json"
        doc = _nested([row])
        doc["data"][0]["paragraphs"][0]["qas"][0]["answers"][0]["answer_start"] += 2
        path.write_text(json.dumps(doc))
    with pytest.raises(InputError) as info:
        load_squad(path)
    assert fragment in str(info.value) and "\n" not in str(info.value)
    if case == "shifted":
        assert "line 2" in str(info.value)  # names the row
    code, _, err = run_cli(["optimize", tiny_qa, "--recipe", qa_recipe(tmp_path, path), "-o", tmp_path / "out"], capsys)
    one_error(code, err, fragment)


# --------------------------------------------------------------------------- SQuAD scoring


@pytest.mark.parametrize("prediction, gold, em, f1", [
    ("The Eiffel Tower!", "eiffel tower", 1.0, 1.0),      # case, article, punctuation
    ("an  apple", "Apple.", 1.0, 1.0),                     # article "an", whitespace
    ("theatre", "the atre", 0.0, 0.0),                    # "the" inside a word is not an article
    ("the big red dog", "red dog", 0.0, 0.8),              # P=2/3, R=1 -> 0.8
    ("red", "big red dog", 0.0, 0.5),                      # P=1, R=1/3 -> 0.5
    ("", "dog", 0.0, 0.0),
    ("a", "the", 1.0, 0.0),                                # both normalise to "": EM 1, no tokens: F1 0
])
def test_squad_normalisation_hand_checked(prediction, gold, em, f1):
    assert qa.exact_match_score(prediction, gold) == em
    assert qa.f1_score(prediction, gold) == pytest.approx(f1)


def test_score_max_over_gold_and_unlabelled_rows(tmp_path):
    context = "the big red dog sat on the mat ."
    rows = [
        {"question": "what sat?", "context": context,
         "answers": [{"text": "red dog", "answer_start": 8}, {"text": "the big red dog", "answer_start": 0}]},
        {"question": "where?", "context": context, "answers": {"text": ["the mat"], "answer_start": [23]}},
        {"question": "unlabelled", "context": context},
    ]
    data = load_squad(write_jsonl(tmp_path / "d.jsonl", rows))
    outputs = np.array([[4.0, 15.0, 0.9], [27.0, 30.0, 0.8], [0.0, 3.0, 0.1]])  # "big red dog", "mat", "the"
    baseline = np.array([[4.0, 15.0, 0.9], [23.0, 30.0, 0.8], [4.0, 7.0, 0.5]])
    m = tasks.get("question-answering").score(outputs, baseline, data, seed=0)
    assert m["exact_match"]["n"] == 2 and m["exact_match"]["value"] == 1.0  # "mat" == "the mat" normalised
    # row 0: vs "red dog" P=2/3 R=1 -> 0.8, vs "the big red dog" P=1 R=2/3... normalised gold "big red dog": 1.0
    assert m["f1"]["value"] == pytest.approx(1.0) and m["f1"]["n"] == 2
    assert m["agreement_with_baseline"]["value"] == pytest.approx(1 / 3) and m["agreement_with_baseline"]["n"] == 3
    # row 1: overlap 3 of 3 + 7 chars -> 0.6; row 2: disjoint -> 0
    assert m["span_f1_with_baseline"]["value"] == pytest.approx((1 + 0.6 + 0) / 3)
    assert set(m["exact_match"]) >= {"value", "n", "ci95"}
    assert m["exact_match"]["ci95"][0] < 1.0  # Wilson: 2 rows prove little
    points = tasks.get("question-answering").budget_points(outputs, baseline, data)
    assert points == ("f1", pytest.approx(100.0))


def test_agreement_is_span_overlap_and_falls_back_to_cosine():
    task = tasks.get("question-answering")
    a = np.array([[0, 10, 1.0], [0, 10, 1.0], [-1, -1, 0.0], [-1, -1, 0.0]])
    b = np.array([[0, 10, 0.5], [5, 15, 0.5], [-1, -1, 0.0], [2, 4, 0.0]])
    assert task.agreement(a, b).tolist() == [1.0, 0.5, 1.0, 0.0]
    logits = np.random.default_rng(0).normal(size=(3, 7, 2))
    assert task.agreement(logits, logits) == pytest.approx(np.ones(3))


# --------------------------------------------------------------------------- prediction


class FakePredictor:
    """Logits that peak on one word of the context (its first token): the span logic, model-free."""

    def __init__(self, tokenizer, target_id: int):
        self.tokenizer, self.target_id, self.max_length, self.fed = tokenizer, target_id, 128, []

    def raw_outputs(self, encoded):
        self.fed.append(sorted(encoded))
        hit = (encoded["input_ids"] == self.target_id).astype(np.float32) * 10
        return np.stack([hit, hit], axis=-1)


def test_long_context_answer_in_a_later_window(tmp_path, tokenizer_dir, long_row):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    context = long_row["context"] + " the kids will find the zebra ."  # "zebra": in no other sentence
    row = {"question": "what will they find ?", "context": context}
    data = load_squad(write_jsonl(tmp_path / "long.jsonl", [row, {"question": "q", "context": "short zebra ."}]))
    enc = tokenizer(row["question"], context, truncation="only_second", max_length=128, stride=64,
                    return_overflowing_tokens=True, return_offsets_mapping=True)
    assert len(enc["input_ids"]) >= 3  # several windows
    first_window_end = max(e for (s, e), q in zip(enc["offset_mapping"][0], enc.sequence_ids(0)) if q == 1)
    start = context.index("zebra")
    assert start > first_window_end  # the answer is only in a later window
    zebra = tokenizer("zebra", add_special_tokens=False)["input_ids"][0]
    fake = FakePredictor(tokenizer, zebra)
    out = qa.TASK.predict(fake, data, batch_size=4)
    assert out.shape == (2, 3) and out.dtype == np.float64
    assert context[int(out[0, 0]):int(out[0, 1])] == "zebra"  # the word, aligned (zebra is several pieces)
    assert "short zebra ."[int(out[1, 0]):int(out[1, 1])] == "zebra"
    assert all("offset_mapping" not in keys and "overflow_to_sample_mapping" not in keys for keys in fake.fed)


def test_span_decoder_matches_an_exhaustive_search(tiny_qa, qa_rows):
    """transformers 5 removed the question-answering pipeline this was compared with: the span decoder
    (``select_spans``) is checked against an exhaustive search over every allowed (start, end) pair of the
    model's own logits, with the pipeline's rule (softmax over the context and [CLS], [CLS] never chosen,
    end >= start, at most MAX_ANSWER_TOKENS tokens)."""
    import torch
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_qa)
    model = AutoModelForQuestionAnswering.from_pretrained(tiny_qa).eval()
    for row in qa_rows[:12]:
        enc = tokenizer(row["question"], row["context"], return_tensors="pt", truncation="only_second", max_length=128)
        allowed = np.array([s == 1 for s in enc.sequence_ids(0)])
        allowed[0] = True  # [CLS] takes part in the softmax, as in the pipeline
        with torch.no_grad():
            out = model(**enc)
        start, end = out.start_logits[0].numpy(), out.end_logits[0].numpy()
        starts, ends, scores = qa.select_spans(start, end, allowed, top_k=5, max_len=qa.MAX_ANSWER_TOKENS)

        def probabilities(logits):
            weights = np.exp(np.where(allowed, logits.astype(np.float64), -10000.0) - logits.max())
            weights = weights / weights.sum()
            weights[0] = 0.0
            return weights

        ps, pe = probabilities(start), probabilities(end)
        best = max((ps[a] * pe[b], a, b) for a in range(len(ps)) for b in range(a, min(a + qa.MAX_ANSWER_TOKENS, len(pe)))
                   if allowed[a] and allowed[b] and a > 0)
        assert (int(starts[0]), int(ends[0])) == (best[1], best[2]), row
        assert scores[0] == pytest.approx(best[0], rel=1e-9)
        assert list(scores) == sorted(scores, reverse=True)


def test_trained_model_has_nontrivial_exact_match(tiny_qa, qa_file):
    data = load_squad(qa_file)
    out = torch_predictor(tiny_qa).predict_data(data)
    m = qa.TASK.score(out, out, data)
    assert m["exact_match"]["value"] >= 0.1, m  # a random span would be right a few % of the time
    assert m["agreement_with_baseline"]["value"] == 1.0


# --------------------------------------------------------------------------- end to end


def qa_recipe(tmp_path: Path, data: Path) -> Path:
    path = tmp_path / "qa.yaml"
    path.write_text(f"name: qa\ntarget: avx512_vnni\npasses:\n  - export\n  - fuse: {{timing_rounds: 3}}\n  - quantize\n"
                    f"evaluation:\n  data: {data}\n  latency_rounds: 3\n  warmup: 1\n  repeats: 1\n")
    return path


def test_optimize_int8_artifact_with_squad_metrics(tmp_path, capsys, tiny_qa, qa_file, qa_rows):
    out = tmp_path / "artifact"
    code, _, err = run_cli(["optimize", tiny_qa, "--recipe", qa_recipe(tmp_path, qa_file), "-o", out], capsys)
    assert code == 0, err
    report = json.loads((out / "report.json").read_text())
    assert report["model"]["task"] == "question-answering"
    stages = report["stages"] if isinstance(report["stages"], list) else list(report["stages"].values())
    assert len(stages) >= 3
    for stage in stages:
        metrics = stage["metrics"]
        assert {"exact_match", "f1", "agreement_with_baseline", "span_f1_with_baseline"} <= set(metrics), stage
        assert metrics["f1"]["n"] == 40
    ref = np.load(out / "reference" / "baseline_outputs.npy", allow_pickle=False)
    assert ref.shape == (40, 3)
    import onnx

    ops = {n.op_type for n in onnx.load(str(out / "model.onnx"), load_external_data=False).graph.node}
    assert ops & {"DynamicQuantizeLinear", "MatMulInteger", "QAttention", "DynamicQuantizeMatMul"}, ops
    check_artifact_loads(out, qa_rows)
    check_bench_report_and_gate(out, capsys)


def check_artifact_loads(qa_artifact, qa_rows):
    """transformers 5 has no extractive question-answering pipeline: the artifact runs as a transformers
    model (start/end logits of the question + context) and answers through xformopt.load()."""
    from transformers import AutoTokenizer

    import xformopt
    from xformopt.clients.transformers_pipeline import OnnxPipelineModel

    model = OnnxPipelineModel(qa_artifact)
    tokenizer = AutoTokenizer.from_pretrained(qa_artifact)
    row = qa_rows[0]
    enc = tokenizer(row["question"], row["context"], return_tensors="np")
    out = model(**enc)
    assert out.start_logits.shape == out.end_logits.shape == enc["input_ids"].shape
    answer = xformopt.load(qa_artifact).predict([{"question": row["question"], "context": row["context"]}])[0]
    assert row["context"][answer["start"]:answer["end"]] == answer["answer"]


def test_optimize_reads_the_official_squad_json(tmp_path, capsys, tiny_qa, qa_rows):
    nested = tmp_path / "dev-v1.1.json"
    nested.write_text(json.dumps(_nested(qa_rows[:12]), indent=2))
    recipe = tmp_path / "export.yaml"
    recipe.write_text(f"name: qa\ntarget: avx512_vnni\npasses:\n  - export\nevaluation:\n  data: {nested}\n"
                      "  latency_rounds: 3\n  warmup: 0\n  repeats: 1\n")
    code, _, err = run_cli(["optimize", tiny_qa, "--recipe", recipe, "-o", tmp_path / "out"], capsys)
    assert code == 0, err


def test_static_int8_and_the_accuracy_budget_read_squad_rows(tmp_path, capsys, tiny_qa, qa_file):
    """Calibration and the budget read the task's rows (question + context pairs) and the budget holds
    the task's metric (F1 points), not a cosine of logits."""
    recipe = tmp_path / "static.yaml"
    recipe.write_text(f"name: qa-static\ntarget: avx512_vnni\npasses:\n  - export\n  - fuse: {{select: all}}\n"
                      f"  - quantize: {{mode: static, calibration_data: {qa_file}, calibration_limit: 16,\n"
                      f"                budget_data: {qa_file}, max_accuracy_drop: 50, min_agreement: 0.5}}\n"
                      f"evaluation:\n  data: {qa_file}\n  latency_rounds: 3\n  warmup: 1\n  repeats: 1\n")
    out = tmp_path / "artifact"
    code, _, err = run_cli(["optimize", tiny_qa, "--recipe", recipe, "-o", out], capsys)
    assert code == 0, err
    record = json.loads((out / "manifest.json").read_text())["passes"][-1]["record"]
    assert record["mode"] == "static" and record["calibration"]["rows"] == 16
    assert record["budget"]["metric"] == "f1" and record["budget_met"] is True
    assert record["agreement"]["measure"] == "answer-span overlap F1"


# --------------------------------------------------------------------------- export parity on pairs


@pytest.fixture(scope="session")
def same_question_file(tmp_path_factory) -> Path:
    """40 rows asking one templated question ("what will they watch ?", one token length) over contexts
    of very different lengths: the held-out shape the first-text-only parity refused."""
    rng, rows = random.Random(5), []
    while len(rows) < 40:
        row = make_row(rng, fillers=rng.randint(0, 12))
        if row["question"].split()[-2] == "watch":
            rows.append({"id": f"same-{len(rows)}", **row, "question": "what will they watch ?"})
    return write_jsonl(tmp_path_factory.mktemp("qa-same-question") / "rows.jsonl", rows)


def test_identical_questions_over_varied_contexts_optimize_and_parity_records_the_pairs(
        tmp_path, capsys, tiny_qa, same_question_file):
    from xformopt.exporting import parity_texts
    from xformopt.models import load_tokenizer

    data = load_squad(same_question_file)
    assert len(set(data.texts)) == 1
    with pytest.raises(InputError, match="at least 3 different token lengths"):  # the questions alone: one length
        parity_texts(data.texts, load_tokenizer(tiny_qa))
    recipe = tmp_path / "qa.yaml"
    recipe.write_text(f"name: qa-same\ntarget: avx512_vnni\npasses:\n  - export\n  - fuse: {{select: all}}\n  - quantize\n"
                      f"evaluation:\n  data: {same_question_file}\n  latency_rounds: 3\n  warmup: 1\n  repeats: 1\n")
    out = tmp_path / "artifact"
    code, _, err = run_cli(["optimize", tiny_qa, "--recipe", recipe, "-o", out], capsys)
    assert code == 0, err
    parity = json.loads((out / "manifest.json").read_text())["passes"][0]["record"]["parity"]
    pairs = parity["pair_lengths"]
    question_tokens = {q for q, _ in pairs}
    assert len(question_tokens) == 1  # the question is the same everywhere: the contexts made the spread
    assert len({c for _, c in pairs}) == len(pairs) >= 3
    tokenizer = load_tokenizer(tiny_qa)
    assert question_tokens == {len(tokenizer(data.texts[0], add_special_tokens=False)["input_ids"])}
    # each batch-1 case is the pair it names: its context's tokens, the question's and the special tokens
    contexts = {len(tokenizer(c, add_special_tokens=False)["input_ids"]) for c in data.text_pairs}
    assert {c for _, c in pairs} <= contexts
    assert parity["batch_sizes"] == [1] * len(pairs) + [2]
    lengths = sorted(len(load_tokenizer(tiny_qa)(t, p)["input_ids"]) for t, p in zip(data.texts, data.text_pairs))
    assert min(parity["sequence_lengths"]) == lengths[0] and max(parity["sequence_lengths"]) == lengths[-1]


def test_parity_catches_a_divergence_only_long_contexts_show(tmp_path, tiny_qa, same_question_file):
    """A graph whose position embeddings are wrong past position 48 agrees with PyTorch on the question
    alone (all a first-text-only parity saw); parity over the pairs as the model receives them fails."""
    import onnx
    from helpers import make_ctx, run_pass
    from onnx import numpy_helper

    from xformopt.errors import PassFailed
    from xformopt.passes.export.run import ExportOptions, check_parity
    from xformopt.runtime.encoder import OrtPredictor, TorchPredictor

    data = load_squad(same_question_file)
    ctx = make_ctx(tiny_qa, data.texts)
    ctx.sample = data
    run_pass("export", ctx, tiny_qa, tmp_path / "onnx")
    model = onnx.load(str(tmp_path / "onnx" / "model.onnx"))
    table = next(i for i in model.graph.initializer if "position_embeddings" in i.name)
    weights = numpy_helper.to_array(table).copy()
    weights[48:] += np.random.default_rng(0).normal(0, 0.5, weights[48:].shape)  # not constant: LayerNorm removes that
    table.CopyFrom(numpy_helper.from_array(weights, table.name))
    onnx.save(model, str(tmp_path / "onnx" / "model.onnx"))

    spec = sources.resolve(str(tiny_qa))
    torch_model, onnx_model = TorchPredictor(spec, tiny_qa, threads=1), OrtPredictor(spec, tmp_path / "onnx", threads=1)
    question = torch_model.tokenize(data.texts[:1])
    assert np.abs(torch_model.raw_outputs(question) - onnx_model.raw_outputs(question)).max() < 1e-4
    with pytest.raises(PassFailed, match=r"export parity failed.*text \+ pair tokens"):
        check_parity(ctx, tiny_qa, tmp_path / "onnx", ExportOptions())
