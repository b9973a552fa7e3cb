"""text-classification: a sequence-classification head; metrics accuracy and macro-F1 where the rows
are labelled, arg-max agreement with the PyTorch fp32 baseline always."""

from __future__ import annotations

import numpy as np

from xformopt.scoring.metrics import accuracy, macro_f1, proportion
from xformopt.tasks.base import AGREEMENT, Metric, Task, argmax_budget_points


class TextClassification(Task):
    name = "text-classification"
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
