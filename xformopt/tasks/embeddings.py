"""feature-extraction: sentence embeddings, mean-pooled as sentence-transformers pools them; metrics
cosine to the PyTorch fp32 embeddings, and a linear probe's accuracy where the rows are labelled."""

from __future__ import annotations


from xformopt.evaluate.metrics import cosine_to_baseline, row_cosine
from xformopt.evaluate.pooling import mean_pool
from xformopt.tasks.base import Metric, Task


class FeatureExtraction(Task):
    name = "feature-extraction"
    summary = "sentence embeddings (mean-pooled token states)"
    auto_model = "AutoModel"
    ort_model = "ORTModelForFeatureExtraction"
    export_task = "feature-extraction"
    headline = "cosine_to_baseline"
    metrics = {"cosine_to_baseline": Metric("Cosine to fp32", relative=True),
               "probe_accuracy": Metric("Probe acc.", percent=True)}
    # Embeddings are compared by cosine downstream: the INT8 ladder holds them to the line users hold
    # embedders to (logits only need their ranking kept).
    agreement_floor = 0.99
    torch_objective = "embedding"

    def finish(self, raw, encoded):
        return mean_pool(raw, encoded["attention_mask"])

    def score(self, outputs, baseline, data, seed=0):
        from xformopt.evaluate.probe import Probe

        if baseline is None:  # both metrics compare with the fp32 embeddings
            return {}
        metrics = {"cosine_to_baseline": cosine_to_baseline(outputs, baseline)}
        if Probe.usable(data.labels):
            metrics["probe_accuracy"] = Probe(baseline, data.labels, seed).score(outputs)
        return metrics

    def budget_points(self, outputs, reference, data):
        if reference is None:
            return "cosine_to_float", 100.0
        return "cosine_to_float", 100.0 * float(row_cosine(outputs, reference).mean())

    def skipped_without_baseline(self):
        return "cosine_to_baseline and probe_accuracy"


TASK = FeatureExtraction()
