"""question-answering: extractive QA (SQuAD): a span of the context answers the question.

Outputs, one row per question, are ``[answer char start, answer char end, score]`` (float64; start = end
= -1 where no span could be read): fixed-shape, so they save as ``reference_outputs.npy`` without pickle,
and the answer text is ``context[start:end]``. Long contexts are read in overlapping windows and the
best span over all windows wins, with the postprocessing of transformers' question-answering pipeline
(its own span decoder, word alignment and score merging), so the numbers describe what a
``pipeline("question-answering")`` serving the artifact would answer.

Metrics: exact match and F1 with the official SQuAD v1.1 normalisation, max over gold answers, on the
answered rows; agreement with the PyTorch fp32 baseline always (identical span, and character-overlap
F1 of the two spans). Headline: ``f1``.
"""

from __future__ import annotations

import collections
import re
import string

import numpy as np

from xformopt.errors import InputError
from xformopt.scoring.metrics import mean_with_bootstrap, proportion, row_cosine
from xformopt.tasks.base import AGREEMENT, Metric, Task, pad_rows
from xformopt.tasks.heads import FEATURES, Head, Prepared, Row, Serving
from xformopt.tasks.qa_data import load_squad

MAX_LENGTH = 384  # the pipeline's and run_qa's window, capped at the model's limit
DOC_STRIDE = 128  # tokens of overlap between windows (the pipeline: min(max_length // 2, 128))
MAX_ANSWER_TOKENS = 30  # run_qa's default (the pipeline's is 15)
NO_SPAN = -1.0


# --------------------------------------------------------------------------- SQuAD v1.1 scoring
# Hand-written: this is the official evaluate-v1.1.py (a few lines); the `evaluate` library's squad
# metric is the same code but downloads its script from the Hub, and tests never touch the network.


def normalize_answer(text: str) -> str:
    """Lower-case, drop punctuation and the articles a/an/the, collapse whitespace (SQuAD v1.1)."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


_PUNCTUATION = frozenset(string.punctuation)


def exact_match_score(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1_score(prediction: str, gold: str) -> float:
    pred, truth = normalize_answer(prediction).split(), normalize_answer(gold).split()
    common = collections.Counter(pred) & collections.Counter(truth)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(truth)
    return 2 * precision * recall / (precision + recall)


def best_over_gold(metric, prediction: str, golds: list[str]) -> float:
    return max(metric(prediction, g) for g in golds)


def span_overlap_f1(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per row, F1 of the character overlap of two [start, end) spans: 1.0 exactly when the spans are
    the same, graded otherwise (a span one word longer keeps most of its credit). Needs no text, so the
    INT8 ladder can compute it from the outputs alone; two empty spans agree, one empty span does not."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    len_a, len_b = np.maximum(a[:, 1] - a[:, 0], 0), np.maximum(b[:, 1] - b[:, 0], 0)
    overlap = np.maximum(np.minimum(a[:, 1], b[:, 1]) - np.maximum(a[:, 0], b[:, 0]), 0)
    total = len_a + len_b
    f1 = np.where(total > 0, 2 * overlap / np.where(total > 0, total, 1), 1.0)
    return np.where((len_a == 0) != (len_b == 0), 0.0, f1)


def same_span(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (np.asarray(a)[:, 0] == np.asarray(b)[:, 0]) & (np.asarray(a)[:, 1] == np.asarray(b)[:, 1])


def answer_texts(outputs: np.ndarray, contexts: list[str]) -> list[str]:
    """The predicted answer strings: ``context[start:end]`` ("" where no span)."""
    return ["" if s < 0 else c[int(s):int(e)] for (s, e), c in zip(np.asarray(outputs)[:, :2], contexts)]


def squad_scores(outputs: np.ndarray, data) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(answered row indices, per-row EM, per-row F1) over the rows with gold answers."""
    answers = data.extra.get("answers") or [[] for _ in range(len(data))]
    rows = np.array([i for i, a in enumerate(answers) if a], dtype=np.int64)
    predicted = answer_texts(outputs[rows], [data.text_pairs[i] for i in rows]) if len(rows) else []
    golds = [[a["text"] for a in answers[i]] for i in rows]
    em = np.array([best_over_gold(exact_match_score, p, g) for p, g in zip(predicted, golds)])
    f1 = np.array([best_over_gold(f1_score, p, g) for p, g in zip(predicted, golds)])
    return rows, em, f1


# --------------------------------------------------------------------------- the task


class AnswerHead(Head):
    """``{answer, score, start, end}`` per ``{question, context}``; long contexts in overlapping windows,
    as the task evaluates the artifact."""

    @staticmethod
    def prepare(predictor, inputs, truncate):
        max_length = min(MAX_LENGTH, predictor.max_length)
        stride = min(max_length // 2, DOC_STRIDE)
        out = []
        for i, item in enumerate(inputs):
            if not (isinstance(item, dict) and isinstance(item.get("question"), str)
                    and isinstance(item.get("context"), str) and item["question"].strip() and item["context"].strip()):
                raise InputError(f"input {i} needs a non-empty 'question' and 'context' (strings)")
            # one tokenizer call per input: its windows depend on its own question's length
            windows = question_windows(predictor.tokenizer, i, item["question"], item["context"], max_length, stride,
                                       f"input {i}")
            rows = [Row({k: list(v) for k, v in w["inputs"].items() if k in FEATURES}) for w in windows]
            out.append(Prepared(rows, {"windows": windows, "context": item["context"]}))
        return out

    @staticmethod
    def finish(predictor, prepared, outputs, **_):
        spans = [window_spans(w, o) for w, o in zip(prepared.context["windows"], outputs)]
        start, end, score = best_answer(prepared.context["context"], spans)
        if start < 0:
            return {"answer": "", "score": 0.0, "start": -1, "end": -1}
        return {"answer": prepared.context["context"][int(start):int(end)], "score": float(score),
                "start": int(start), "end": int(end)}


class QuestionAnswering(Task):
    name = "question-answering"
    head = AnswerHead
    serving = Serving(routes=("/predict",), body="AnswerRequest", options=(), structured="question and context",
                      warmup=lambda text: {"question": "what?", "context": text})
    summary = "extractive QA: the span of a context that answers a question (SQuAD)"
    auto_model = "AutoModelForQuestionAnswering"
    export_outputs = ("start_logits", "end_logits")
    architectures = ("ForQuestionAnswering",)
    headline = "f1"
    metrics = {"f1": Metric("F1", percent=True), "exact_match": Metric("Exact match", percent=True),
               "agreement_with_baseline": AGREEMENT, "span_f1_with_baseline": Metric("Span F1 to fp32", relative=True)}
    agreement_measure = "answer-span overlap F1"
    # prune and distill optimise sequence logits or pooled embeddings; start/end logits over a window
    # are neither, so those passes do not take QA models (yet).
    passes = ("export", "fuse", "quantize")
    torch_objective = None

    def default_data(self, split):
        raise InputError("question-answering has no vendored data: pass --data FILE (SQuAD JSON, or JSON/JSONL rows "
                         "with question, context and answers) and the same for calibration/budget data")

    def load(self, path, *, label2id=None, limit=None, seed=0, columns=None, require_labels=None):
        data = load_squad(path, limit=limit, seed=seed, columns=columns)
        if require_labels and not any(data.extra["answers"]):
            raise InputError(f"{data.path}: no question has a gold answer, and this step needs labelled rows; "
                             "give answers (text and answer_start) for some questions")
        return data

    def combine(self, outputs):
        # [B, T, 2]: start and end logits side by side, so export parity and the INT8 cosine check both
        return np.stack([outputs[0], outputs[1]], axis=-1)

    # ------------------------------------------------------------------ predicting

    def predict(self, predictor, data, batch_size=32, progress=None):
        tokenizer = predictor.tokenizer
        if not getattr(tokenizer, "is_fast", False):
            raise InputError("question answering needs a fast (Rust) tokenizer: answer spans are read from its "
                             "character offsets; save the model with a tokenizer.json")
        max_length = min(MAX_LENGTH, predictor.max_length)
        stride = min(max_length // 2, DOC_STRIDE)
        questions, contexts = list(data.texts), list(data.text_pairs or [])
        if len(contexts) != len(questions):
            raise InputError("question answering needs a context for every question (TextDataset.text_pairs)")
        out = np.zeros((len(questions), 3), dtype=np.float64)
        # Rows are read a chunk at a time; all windows of a chunk are batched together (sorted by length).
        for first in range(0, len(questions), batch_size):
            rows = range(first, min(first + batch_size, len(questions)))
            where = data.path or data.source
            windows = [w for i in rows for w in question_windows(tokenizer, i, questions[i], contexts[i], max_length, stride,
                                                                   f"{where} row {i}")]
            spans = _run_windows(predictor, tokenizer, windows, batch_size)
            for i in rows:
                out[i] = best_answer(contexts[i], [spans[k] for k, w in enumerate(windows) if w["row"] == i])
            if progress is not None:
                progress(rows.stop, len(questions))
        return out

    def timing_inputs(self, data):
        # A served request carries one question and its context; the predictor's single-window
        # tokenisation (truncated at its max length) is what latency is measured on.
        return list(data.texts), data.text_pairs

    # ------------------------------------------------------------------ scoring

    def score(self, outputs, baseline, data, seed=0):
        outputs = np.asarray(outputs)
        baseline = None if baseline is None else np.asarray(baseline)
        metrics = {}
        rows, em, f1 = squad_scores(outputs, data)
        if len(rows):
            metrics["exact_match"] = proportion(em.astype(bool))
            metrics["f1"] = mean_with_bootstrap(f1, seed)
        if baseline is None:  # a bench run without the fp32 reference: the answers alone
            return metrics
        metrics["agreement_with_baseline"] = proportion(same_span(outputs, baseline))
        metrics["span_f1_with_baseline"] = mean_with_bootstrap(span_overlap_f1(outputs, baseline), seed)
        return metrics

    def agreement(self, outputs, reference):
        """Per row: character-overlap F1 of the two predicted spans (1.0 iff the same span). Raw
        start/end logits ([B, T, 2], what ``Predictor.predict`` returns) fall back to their cosine."""
        outputs, reference = np.asarray(outputs), np.asarray(reference)
        if outputs.ndim == 2 and outputs.shape[-1] == 3:
            return span_overlap_f1(outputs, reference)
        return row_cosine(outputs, reference)

    def budget_points(self, outputs, reference, data):
        rows, _, f1 = squad_scores(np.asarray(outputs), data)
        if len(rows):
            return "f1", 100.0 * float(f1.mean())
        if reference is None:
            return "span_agreement_with_float", 100.0
        return "span_agreement_with_float", 100.0 * float(same_span(outputs, reference).mean())

    def skipped_without_baseline(self):
        return "agreement_with_baseline and span_f1_with_baseline"


# --------------------------------------------------------------------------- windows


def question_windows(tokenizer, row: int, question: str, context: str, max_length: int, stride: int,
                     where: str) -> list[dict]:
    """The overlapping windows of one (question, context), tokenised as the QA pipeline does; ``where``
    names the row in messages."""
    question_first = tokenizer.padding_side == "right"
    room = max_length - len(tokenizer(question, add_special_tokens=False)["input_ids"]) - tokenizer.num_special_tokens_to_add(pair=True)
    if room < 2:
        raise InputError(f"{where}: the question alone fills the model's {max_length}-token "
                         "window, leaving no room for the context; shorten the question")
    encoded = tokenizer(
        question if question_first else context,
        context if question_first else question,
        truncation="only_second" if question_first else "only_first",
        max_length=max_length,
        stride=min(stride, room - 1),  # the tokenizer refuses a stride as long as the context's room
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        return_token_type_ids=True,
    )
    context_id = 1 if question_first else 0
    inputs = [k for k in tokenizer.model_input_names if k in encoded]
    if "token_type_ids" in encoded and "token_type_ids" not in inputs:
        inputs.append("token_type_ids")  # the graph ignores what it does not take (ort_feed / forward)
    windows = []
    for w, encoding in enumerate(encoded.encodings):
        # 1 where a token cannot be in the answer (question, specials), except [CLS]: the pipeline keeps
        # it in the softmax (models use it for "no answer") and then zeroes its probability.
        p_mask = np.array([s != context_id for s in encoding.sequence_ids], dtype=np.int64)
        if tokenizer.cls_token_id is not None:
            p_mask[np.asarray(encoding.ids) == tokenizer.cls_token_id] = 0
        windows.append({"row": row, "encoding": encoding, "p_mask": p_mask, "context_id": context_id,
                        "inputs": {k: encoded[k][w] for k in inputs}})
    return windows


def _run_windows(predictor, tokenizer, windows: list[dict], batch_size: int) -> list[list[tuple]]:
    """Candidate spans (char start, char end, score) per window, best first."""
    spans: list[list[tuple]] = [[] for _ in windows]
    order = sorted(range(len(windows)), key=lambda k: len(windows[k]["p_mask"]))
    for first in range(0, len(order), batch_size):
        batch = order[first:first + batch_size]
        # offset_mapping and overflow keys never reach the graph: only the model's inputs are padded and fed
        encoded = pad_rows(tokenizer, [windows[k]["inputs"] for k in batch])
        logits = predictor.raw_outputs(encoded)  # [B, T, 2]
        for j, k in enumerate(batch):
            n = len(windows[k]["p_mask"])
            cut = slice(None, n) if tokenizer.padding_side == "right" else slice(logits.shape[1] - n, None)
            spans[k] = window_spans(windows[k], logits[j, cut])
    return spans


def window_spans(window: dict, logits: np.ndarray) -> list[tuple]:
    """Candidate spans (char start, char end, score) of one window from its own [tokens, 2] start/end logits."""
    # 2*top_k+10 candidates per window (as transformers' QA pipeline kept): aligning to words may merge some.
    starts, ends, scores = select_spans(logits[:, 0], logits[:, 1], np.asarray(window["p_mask"]) == 0,
                                        top_k=12, max_len=MAX_ANSWER_TOKENS)
    return [(*_char_span(window["encoding"], int(s), int(e), window["context_id"]), float(p))
            for s, e, p in zip(starts, ends, scores)]


def select_spans(start_logits: np.ndarray, end_logits: np.ndarray, allowed: np.ndarray, top_k: int,
                 max_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ``top_k`` token spans (start, end, probability) of one window, as transformers 4's
    question-answering pipeline chose them: softmax over the tokens that may hold the answer
    (``allowed``: the context's), the first token ([CLS]) never, end >= start, at most ``max_len``
    tokens. Written here: transformers 5 removed the extractive QA pipeline."""
    def softmax(logits: np.ndarray) -> np.ndarray:
        masked = np.where(allowed, logits.astype(np.float64), -10000.0)
        weights = np.exp(masked - masked.max())
        return weights / weights.sum()

    start, end = softmax(start_logits), softmax(end_logits)
    start[0] = end[0] = 0.0
    candidates = np.tril(np.triu(np.outer(start, end)), max_len - 1)
    flat = candidates.ravel()
    order = np.argsort(-flat, kind="stable")[:top_k]
    starts, ends = np.unravel_index(order, candidates.shape)
    keep = allowed[starts] & allowed[ends]
    starts, ends = starts[keep], ends[keep]
    return starts, ends, candidates[starts, ends]


def _char_span(encoding, s: int, e: int, sequence_index: int) -> tuple[int, int]:
    """Token span -> character span of the context, widened to whole words (the pipeline's align_to_words)."""
    start_word, end_word = encoding.token_to_word(s), encoding.token_to_word(e)
    if start_word is not None and end_word is not None:
        start = encoding.word_to_chars(start_word, sequence_index=sequence_index)
        end = encoding.word_to_chars(end_word, sequence_index=sequence_index)
        if start is not None and end is not None:
            return start[0], end[1]
    return encoding.offsets[s][0], encoding.offsets[e][1]


def best_answer(context: str, windows: list[list[tuple]]) -> np.ndarray:
    """The answer over all windows: candidates with the same text pool their scores (as the pipeline
    merges them), the highest total wins; the first span seen for a text is the one kept."""
    merged: dict[str, list] = {}
    for candidates in windows:
        for start, end, score in candidates:
            text = context[start:end]
            if text in merged:
                merged[text][2] += score
            else:
                merged[text] = [start, end, score]
    if not merged:
        return np.array([NO_SPAN, NO_SPAN, 0.0])
    start, end, score = max(merged.values(), key=lambda v: v[2])  # max keeps the first of equal scores
    return np.array([float(start), float(end), float(score)])


TASK = QuestionAnswering()
