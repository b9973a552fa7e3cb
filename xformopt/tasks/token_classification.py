"""token-classification: one tag per word (NER, POS, chunking) from a ``...ForTokenClassification`` head.

Rows are pre-split words (xformopt/tasks/token_data.py). Each word's logits are the logits of its
FIRST sub-token, as transformers' token-classification examples label and score words; outputs are
``[rows, max words, labels]`` float32, NaN beyond a row's words and for words the model never saw
(cut off by truncation at the model's length limit, or tokenized to nothing).

Metrics: entity-level precision/recall/F1 with seqeval in its default conlleval-compatible mode (IOB2
tags), with a seeded bootstrap over sentences; token accuracy (Wilson interval); word-level arg-max
agreement with the PyTorch fp32 baseline always. A word without logits is predicted as the model's
"O" tag (else its tag 0) and counted (``words_without_logits``), so truncation costs recall honestly.

A tagset without B-/I-/E-/S- prefixes (POS tags such as NOUN, VERB) has no multi-word entities: every
tagged word is then its own entity ("word" scheme), so ``entity_f1`` is the micro-F1 over tagged words,
which equals token accuracy when no word is "O". The headline stays ``entity_f1`` for both kinds.
"""

from __future__ import annotations

import numpy as np

from xformopt.errors import InputError
from xformopt.scoring.metrics import proportion
from xformopt.tasks.base import AGREEMENT, Metric, Task
from xformopt.tasks.heads import Head, Prepared, Serving, row_of, single_rows
from xformopt.tasks.token_data import load_tagged

PREFIXES = ("B-", "I-", "E-", "S-")
OUTSIDE = "O"
# Predictor caps every tokenization at 512 tokens (xformopt.runtime.encoder.MAX_LENGTH): ``finish`` pads
# sub-token outputs to this width so batches of different lengths stack into one array.
TOKEN_WIDTH = 512
BOOTSTRAP = 200


class TokenHead(Head):
    """Entities per text, as transformers' ``pipeline(aggregation_strategy="simple")`` returns them."""

    @staticmethod
    def prepare(predictor, texts, truncate):
        encoded, _ = single_rows(predictor, texts, truncate, return_special_tokens_mask=True,
                                 return_offsets_mapping=True)
        return [Prepared([row_of(encoded, i)], {"text": texts[i], "offsets": np.asarray(encoded["offset_mapping"][i]),
                                                "special": np.asarray(encoded["special_tokens_mask"][i])})
                for i in range(len(texts))]

    @staticmethod
    def finish(predictor, prepared, outputs, **_):
        from transformers.pipelines.token_classification import AggregationStrategy

        logits = outputs[0].astype(np.float32)
        shifted = np.exp(logits - logits.max(-1, keepdims=True))
        scores = shifted / shifted.sum(-1, keepdims=True)
        pipeline = _pipeline_postprocessor(predictor)
        ids = np.asarray(prepared.rows[0].features["input_ids"])
        context = prepared.context
        pre = pipeline.gather_pre_entities(context["text"], ids, scores, context["offsets"], context["special"],
                                           AggregationStrategy.SIMPLE)
        entities = pipeline.aggregate(pre, AggregationStrategy.SIMPLE)
        return [{"entity_group": e["entity_group"], "score": float(e["score"]), "word": e["word"],
                 "start": int(e["start"]), "end": int(e["end"])}
                for e in entities if e.get("entity_group") != "O"]


class TokenClassification(Task):
    name = "token-classification"
    head = TokenHead
    serving = Serving(routes=("/predict",), body="TokensRequest")
    summary = "one tag per word: named entities (IOB2), part of speech"
    auto_model = "AutoModelForTokenClassification"
    export_outputs = ("logits",)
    architectures = ("ForTokenClassification",)
    headline = "entity_f1"
    labels_from_config = True
    needs_labels = False  # untagged sentences still give agreement with the fp32 baseline
    passes = ("export", "fuse", "quantize")  # prune/distill optimise sequence-level objectives only
    metrics = {"entity_f1": Metric("Entity F1", percent=True), "token_accuracy": Metric("Token acc.", percent=True),
               "entity_precision": Metric("Entity P", percent=True), "entity_recall": Metric("Entity R", percent=True),
               "agreement_with_baseline": AGREEMENT}
    agreement_measure = "word tag agreement"

    # ------------------------------------------------------------------ data

    def load(self, path, *, label2id, limit, seed, columns=None, require_labels=None):
        return load_tagged(path, label2id=label2id, limit=limit, seed=seed, columns=columns,
                           require_labels=bool(require_labels))

    # ------------------------------------------------------------------ running a stage

    def finish(self, raw, encoded):
        """Sub-token logits of plain texts (parity, the INT8 cosine on sample texts): padding positions
        zeroed and rows padded with zeros to TOKEN_WIDTH, so a row's cosine sees only its real tokens."""
        raw = np.where(encoded["attention_mask"][..., None].astype(bool), raw, 0.0).astype(np.float32)
        width = max(TOKEN_WIDTH, raw.shape[1])
        return np.pad(raw, ((0, 0), (0, width - raw.shape[1]), (0, 0)))

    def predict(self, predictor, data, batch_size=32, progress=None):
        words = sentence_words(data)
        width = max(len(w) for w in words)
        out: np.ndarray | None = None
        # By word count, so each batch pads little; rows are written back at their own index.
        order = sorted(range(len(words)), key=lambda i: len(words[i]))
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            encoded = self.tokenize_words(predictor, [words[i] for i in idx])
            logits = predictor.raw_outputs(dict(encoded))
            if out is None:
                out = np.full((len(words), width, logits.shape[-1]), np.nan, dtype=np.float32)
            for b, row in enumerate(idx):
                positions, word_index = first_subtokens(encoded.word_ids(b))
                out[row, word_index] = logits[b, positions]
            if progress is not None:
                progress(start + len(idx), len(order))
        return out

    @staticmethod
    def tokenize_words(predictor, batch: list[list[str]]):
        try:
            return predictor.tokenizer(batch, is_split_into_words=True, padding=True, truncation=True,
                                       max_length=predictor.max_length, return_tensors="np")
        except (ValueError, AssertionError) as exc:
            if "add_prefix_space" in str(exc):  # byte-level BPE (RoBERTa, GPT-2) on pre-split words
                raise InputError("this tokenizer needs add_prefix_space=True for pre-split words; re-save it with "
                                 "AutoTokenizer.from_pretrained(MODEL, add_prefix_space=True).save_pretrained(MODEL)") from None
            raise

    # ------------------------------------------------------------------ scoring

    def score(self, outputs, baseline, data, seed=0):
        valid = _has_logits(outputs)
        metrics = {}
        if baseline is not None:  # a bench run without the fp32 reference scores the tags alone
            both = valid & _has_logits(baseline)
            metrics = {"agreement_with_baseline": proportion((_argmax(outputs) == _argmax(baseline))[both])}
        gold = data.extra.get("tags")
        if gold is None:
            return metrics
        names = _label_names(data, outputs.shape[-1])
        pred = predicted_tags(outputs, [len(t) for t in gold], names)
        lengths = np.array([len(t) for t in gold])
        unseen = int(sum((~valid[i, :n]).sum() for i, n in enumerate(lengths)))
        entity = entity_scores([[names[t] for t in s] for s in gold], [[names[t] for t in s] for s in pred],
                               names, seed=seed)
        hits = np.concatenate([np.asarray(g) == np.asarray(p) for g, p in zip(gold, pred)])
        accuracy = {**proportion(hits), "words_without_logits": unseen}
        return {**entity, "token_accuracy": accuracy, **metrics}

    def agreement(self, outputs, reference):
        """Per row: the fraction of the reference's words (positions with logits) whose arg-max tag agrees."""
        keep = _has_logits(reference) & _has_logits(outputs)
        same = (_argmax(outputs) == _argmax(reference)) & keep
        counts = keep.reshape(len(keep), -1).sum(1)
        return np.where(counts > 0, same.reshape(len(same), -1).sum(1) / np.maximum(counts, 1), 1.0)

    def budget_points(self, outputs, reference, data):
        """Entity F1 in points where the rows are tagged (``outputs`` from ``predict``: word-level),
        else word-level agreement with the float graph's ``reference``."""
        gold = data.extra.get("tags")
        if gold is not None:
            if outputs.ndim != 3 or outputs.shape[1] < max(len(t) for t in gold):
                raise ValueError("budget_points needs word-level outputs (TokenClassification.predict on the budget rows)")
            names = _label_names(data, outputs.shape[-1])
            pred = predicted_tags(outputs, [len(t) for t in gold], names)
            f1 = entity_counts([[names[t] for t in s] for s in gold], [[names[t] for t in s] for s in pred], names)
            return "entity_f1", 100.0 * _f1(*f1.sum(0))
        if reference is None:
            return "agreement_with_float", 100.0
        return "agreement_with_float", 100.0 * float(np.mean(self.agreement(outputs, reference)))


# --------------------------------------------------------------------------- helpers


def sentence_words(data) -> list[list[str]]:
    """The rows' words: the loader's, else each text split on whitespace (a dataset another loader read)."""
    words = data.extra.get("words")
    return [list(w) for w in words] if words is not None else [t.split() for t in data.texts]


def first_subtokens(word_ids) -> tuple[np.ndarray, np.ndarray]:
    """(token position, word index) of each word's first sub-token; special tokens have no word."""
    positions, words, previous = [], [], None
    for position, word in enumerate(word_ids):
        if word is not None and word != previous:
            positions.append(position)
            words.append(word)
        previous = word
    return np.asarray(positions, dtype=np.int64), np.asarray(words, dtype=np.int64)


def _has_logits(outputs: np.ndarray) -> np.ndarray:
    """[rows, positions]: True where a position carries logits (not a NaN pad, not finish's zero pad)."""
    outputs = np.asarray(outputs)
    return np.isfinite(outputs).all(-1) & (outputs != 0).any(-1)


def _argmax(outputs: np.ndarray) -> np.ndarray:
    return np.where(np.isnan(outputs), -np.inf, outputs).argmax(-1)


def _label_names(data, num_labels: int) -> dict[int, str]:
    names = dict(data.label_names or {})
    return {i: names.get(i, str(i)) for i in range(num_labels)}


def fallback_tag(names: dict[int, str]) -> int:
    """What a word the model never saw is predicted as: the "O" tag, else tag 0."""
    return next((i for i, n in names.items() if n == OUTSIDE), 0)


def predicted_tags(outputs: np.ndarray, lengths, names: dict[int, str]) -> list[list[int]]:
    ids = _argmax(outputs)
    ids = np.where(_has_logits(outputs), ids, fallback_tag(names))
    return [ids[i, :n].tolist() for i, n in enumerate(lengths)]


def scheme(names) -> str:
    """"IOB2" when every tag but O carries a B-/I-/E-/S- prefix, else "word" (POS-like tags)."""
    tags = [n for n in (names.values() if isinstance(names, dict) else names) if n != OUTSIDE]
    return "IOB2" if tags and all(t.startswith(PREFIXES) for t in tags) else "word"


def entity_counts(gold: list[list[str]], pred: list[list[str]], names) -> np.ndarray:
    """Per sentence: [true positives, predicted entities, gold entities], entities as seqeval's default
    (conlleval) mode finds them. seqeval chains sentences with an "O" between them, so these sum to
    exactly the counts ``seqeval.metrics.f1_score`` uses (micro average)."""
    from seqeval.metrics.sequence_labeling import get_entities

    per_word = scheme(names) == "word"

    def entities(tags: list[str]) -> set:
        if per_word:  # each tagged word is its own entity
            tags = [t if t == OUTSIDE else f"B-{t}" for t in tags]
        return set(get_entities(tags))

    rows = []
    for g, p in zip(gold, pred):
        true, guess = entities(g), entities(p)
        rows.append((len(true & guess), len(guess), len(true)))
    return np.asarray(rows, dtype=np.int64).reshape(-1, 3)


def _ratio(a: float, b: float) -> float:
    return float(a / b) if b else 0.0  # seqeval's zero_division default


def _f1(tp: float, n_pred: float, n_true: float) -> float:
    return _ratio(2 * tp, n_pred + n_true)


def entity_scores(gold, pred, names, seed: int = 0, resamples: int = BOOTSTRAP) -> dict:
    """Entity precision, recall and F1 with seeded percentile-bootstrap 95% intervals over sentences
    (entities in one sentence are not independent, sentences are)."""
    counts = entity_counts(gold, pred, names)
    n = len(counts)
    rng = np.random.default_rng(seed)
    boot = np.stack([counts[rng.integers(0, n, n)].sum(0) for _ in range(resamples)]).astype(np.float64)
    tp, n_pred, n_true = counts.sum(0)
    values = {
        "entity_precision": (_ratio(tp, n_pred), [_ratio(t, p) for t, p, _ in boot]),
        "entity_recall": (_ratio(tp, n_true), [_ratio(t, g) for t, _, g in boot]),
        "entity_f1": (_f1(tp, n_pred, n_true), [_f1(*row) for row in boot]),
    }
    kind = scheme(names)
    return {key: {"value": value, "n": n,
                  "ci95": [float(np.percentile(samples, 2.5)), float(np.percentile(samples, 97.5))],
                  "entities": int(n_true), "predicted_entities": int(n_pred), "scheme": kind}
            for key, (value, samples) in values.items()}


TASK = TokenClassification()


def _pipeline_postprocessor(predictor):
    """transformers' TokenClassificationPipeline as a postprocessor only (no model): its entity
    gathering and "simple" aggregation are reused as they are, so served entities are the pipeline's."""
    cached = getattr(predictor, "_token_pipeline", None)
    if cached is None:
        from types import SimpleNamespace

        from transformers import TokenClassificationPipeline

        cached = TokenClassificationPipeline.__new__(TokenClassificationPipeline)
        cached.tokenizer = predictor.tokenizer
        cached.framework = "np"  # offsets are numpy already (the pipeline calls .item() on torch ones)
        cached.model = SimpleNamespace(config=SimpleNamespace(id2label=predictor.labels))
        object.__setattr__(predictor, "_token_pipeline", cached)
    return cached
