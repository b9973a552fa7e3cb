"""text-classification: a sequence-classification head; metrics accuracy and macro-F1 where the rows
are labelled, arg-max agreement with the PyTorch fp32 baseline always."""

from __future__ import annotations

import numpy as np

from xformopt.errors import InputError
from xformopt.scoring.metrics import accuracy, macro_f1, proportion
from xformopt.tasks.base import AGREEMENT, Metric, Task, argmax_budget_points
from xformopt.tasks.heads import Head, Prepared, Serving, is_pair, row_of, tokenize


def is_reranker(config: dict) -> bool:
    """A sequence-classification head with one output scores a pair: a reranker (text-ranking), as TEI
    tells them apart; a classifier has two labels or more."""
    labels = config.get("id2label") or config.get("label2id") or {}
    count = config.get("num_labels", len(labels) if isinstance(labels, dict) and labels else None)
    return count == 1


class ClassificationHead(Head):
    """``[{label, score}]`` per input, best first; texts or (text, text_pair) tuples."""

    pairs = True

    @staticmethod
    def prepare(predictor, inputs, truncate):
        singles = [i for i, x in enumerate(inputs) if isinstance(x, str)]
        pairs = [i for i, x in enumerate(inputs) if is_pair(x)]
        bad = sorted(set(range(len(inputs))) - set(singles) - set(pairs))
        if bad:
            hint = (" (a list is a batch: pass a pair as a tuple (text, text_pair), or use pairs=)"
                    if isinstance(inputs[bad[0]], list) else "")
            raise InputError(f"input {bad[0]} is neither a text nor a (text, text_pair) tuple of strings{hint}")
        out: list[Prepared | None] = [None] * len(inputs)
        if singles:
            encoded = tokenize(predictor, [inputs[i] for i in singles], None, truncate)
            for k, i in enumerate(singles):
                out[i] = Prepared([row_of(encoded, k)])
        if pairs:
            encoded = tokenize(predictor, [inputs[i][0] for i in pairs], [inputs[i][1] for i in pairs], truncate)
            for k, i in enumerate(pairs):
                out[i] = Prepared([row_of(encoded, k)])
        return out

    @staticmethod
    def finish(predictor, prepared, outputs, raw_scores=False, **_):
        logits = outputs[0].astype(np.float64)
        if raw_scores:
            scores = logits
        elif len(logits) == 1 or predictor.multi_label:
            scores = 1.0 / (1.0 + np.exp(-logits))  # the pipeline's sigmoid for one-logit heads
        else:
            shifted = np.exp(logits - logits.max())
            scores = shifted / shifted.sum()
        names = predictor.labels
        ranked = sorted(range(len(scores)), key=lambda k: -scores[k])
        return [{"label": names.get(k, f"LABEL_{k}"), "score": float(scores[k])} for k in ranked]


class TextClassification(Task):
    name = "text-classification"
    head = ClassificationHead
    serving = Serving(routes=("/predict",), body="ClassifyRequest", options=("truncate", "raw_scores"),
                      two_texts_are_a_pair=True)
    summary = "one label per text (or text pair): sentiment, topic, NLI"
    auto_model = "AutoModelForSequenceClassification"
    export_outputs = ("logits",)
    architectures = ("ForSequenceClassification",)
    headline = "accuracy"
    metrics = {"accuracy": Metric("Accuracy", percent=True), "macro_f1": Metric("Macro-F1"),
               "agreement_with_baseline": AGREEMENT}
    labels_from_config = True
    needs_labels = True
    passes = ("export", "fuse", "quantize", "prune", "distill")
    torch_objective = "logits"

    def claims(self, config):
        return super().claims(config) and not is_reranker(config)

    def score(self, outputs, baseline, data, seed=0):
        pred = outputs.argmax(-1)
        metrics = {} if baseline is None else {"agreement_with_baseline": proportion(pred == baseline.argmax(-1))}
        if data.labels is not None:
            y = np.asarray(data.labels)
            metrics = {"accuracy": accuracy(pred, y), "macro_f1": macro_f1(pred, y), **metrics}
        return metrics

    def row_scores(self, outputs, data):
        if data.labels is None:
            return None
        return (np.asarray(outputs).argmax(-1) == np.asarray(data.labels)).astype(np.float64)

    def budget_points(self, outputs, reference, data):
        return argmax_budget_points(outputs, reference, data.labels)


TASK = TextClassification()
