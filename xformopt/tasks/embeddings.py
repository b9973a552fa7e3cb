"""feature-extraction: sentence embeddings, mean-pooled as sentence-transformers pools them; metrics
cosine to the PyTorch fp32 embeddings, the overlap of each text's 10 nearest neighbours with those the fp32
embeddings give (``neighbour_overlap_at_10``), a linear probe's accuracy where the rows are labelled, and
retrieval recall@k where they are pairs (``text`` / ``text_pair``: two texts that should be near).

A pair set is embedded as a bi-encoder serves it, each side on its own: outputs are then
``(rows, 2, hidden)`` (text, pair), and cosine compares every embedding of both sides.

INT8 budget (``max_accuracy_drop``): the worst of the task's drops, in points, against the float
graph on the budget rows: 100 x (1 - mean cosine), and where the rows allow, recall@1 and recall@5
(pairs) and probe accuracy (labels: the probe is fitted on the float graph's embeddings, then
scores both). Cosine alone passes graphs that keep vectors close but reorder neighbours.
"""

from __future__ import annotations

import numpy as np

from xformopt.scoring.metrics import cosine_to_baseline, row_cosine
from xformopt.scoring.pooling import mean_pool
from xformopt.scoring.probe import Probe
from xformopt.scoring.retrieval import NEIGHBOURS, RECALL_AT, neighbour_overlap, recall_at_k
from xformopt.tasks.base import Metric, Task
from xformopt.tasks.heads import Head, Prepared, Serving, id_row, is_token_ids, l2_normalize, single_rows


def _paired(outputs: np.ndarray) -> bool:
    return np.ndim(outputs) == 3 and np.shape(outputs)[1] == 2


def _embeddings(outputs: np.ndarray) -> np.ndarray:
    """Every embedding as one row (both sides of a pair set)."""
    return np.asarray(outputs).reshape(-1, np.shape(outputs)[-1])


def _texts(outputs: np.ndarray) -> np.ndarray:
    """One embedding per row, the row's text (what the probe and the labels describe)."""
    return np.asarray(outputs)[:, 0] if _paired(outputs) else np.asarray(outputs)


class EmbeddingHead(Head):
    """One vector per text (or list of token ids), pooled as the model's sentence-transformers modules say."""

    embeds = True

    @staticmethod
    def prepare(predictor, inputs, truncate):
        texts = [i for i, x in enumerate(inputs) if not is_token_ids(x)]
        out: list[Prepared | None] = [None] * len(inputs)
        if texts:
            for i, prepared in zip(texts, single_rows(predictor, [inputs[i] for i in texts], truncate)[1]):
                out[i] = prepared
        for i in sorted(set(range(len(inputs))) - set(texts)):
            out[i] = Prepared([id_row(predictor, inputs[i], truncate, i)])
        return out

    @staticmethod
    def finish(predictor, prepared, outputs, normalize=None, dimensions=None, all_tokens=False, **_):
        """The pooled vector; ``dimensions``: its first N, normalised after the cut (Matryoshka, as TEI
        does it); ``all_tokens``: every token's vector instead, unpooled (TEI's /embed_all)."""
        states = outputs[0].astype(np.float32)
        if all_tokens:
            return states
        vector = predictor.pooling(states)[:dimensions]
        return l2_normalize(vector) if (predictor.pooling.normalize if normalize is None else normalize) else vector


class FeatureExtraction(Task):
    name = "feature-extraction"
    head = EmbeddingHead
    serving = Serving(routes=("/v1/embeddings", "/embed"), main="/embed", kind="embed", field="input")
    summary = "sentence embeddings (mean-pooled token states)"
    auto_model = "AutoModel"
    headline = "cosine_to_baseline"
    metrics = {"cosine_to_baseline": Metric("Cosine to fp32", relative=True, bounds=(-1.0, 1.0)),
               "probe_accuracy": Metric("Probe acc.", percent=True),
               **{f"recall_at_{k}": Metric(f"Recall@{k}", percent=True) for k in RECALL_AT},
               # what a nearest-neighbour index sees: the texts each text finds, against those the fp32 model finds
               f"neighbour_overlap_at_{NEIGHBOURS}": Metric(f"kNN overlap@{NEIGHBOURS}", relative=True)}
    # Embeddings are compared by cosine downstream: the INT8 ladder holds them to the line users hold
    # embedders to (logits only need their ranking kept).
    agreement_floor = 0.99
    passes = ("export", "fuse", "quantize", "prune", "distill")
    torch_objective = "embedding"

    def finish(self, raw, encoded):
        return mean_pool(raw, encoded["attention_mask"])

    def predict(self, predictor, data, batch_size=32, progress=None):
        if data.text_pairs is None:
            return predictor.predict(data.texts, None, batch_size=batch_size, progress=progress)
        n = len(data.texts)
        both = predictor.predict([*data.texts, *data.text_pairs], None, batch_size=batch_size, progress=progress)
        return np.stack([both[:n], both[n:]], axis=1)

    def timing_inputs(self, data):
        return list(data.texts), None  # a served embedder gets one text per request, pair sets too

    def model_inputs(self, data):
        # both sides of a pair set are embedded, each on its own: parity sees the partners too
        return [*data.texts, *(data.text_pairs or [])], None

    def agreement(self, outputs, reference):
        return row_cosine(_embeddings(outputs), _embeddings(reference))

    def score(self, outputs, baseline, data, seed=0):
        # recall needs no baseline: the partners are the answers
        metrics = {f"recall_at_{k}": recall_at_k(outputs[:, 0], outputs[:, 1], k)
                   for k in RECALL_AT} if _paired(outputs) else {}
        if baseline is None:  # cosine and the probe compare with the fp32 embeddings
            return metrics
        metrics["cosine_to_baseline"] = cosine_to_baseline(_embeddings(outputs), _embeddings(baseline))
        overlap = neighbour_overlap(_texts(outputs), _texts(baseline), seed=seed)
        if overlap is not None:
            metrics[f"neighbour_overlap_at_{NEIGHBOURS}"] = overlap
        if Probe.usable(data.labels):
            metrics["probe_accuracy"] = Probe(_texts(baseline), data.labels, seed).score(_texts(outputs))
        return {name: metrics[name] for name in self.metrics if name in metrics}

    def budget_components(self, outputs, reference, data) -> dict:
        """Each measure the budget holds: its value on the float graph and on ``outputs``, in points,
        and the drop (float - outputs)."""
        def row(float_points: float, points: float) -> dict:
            return {"float": round(float_points, 4), "value": round(points, 4),
                    "drop": round(float_points - points, 4)}

        parts = {"cosine_to_float": row(100.0, 100.0 * float(self.agreement(outputs, reference).mean()))}
        if _paired(outputs):
            for k in RECALL_AT:
                parts[f"recall_at_{k}"] = row(100.0 * recall_at_k(reference[:, 0], reference[:, 1], k)["value"],
                                              100.0 * recall_at_k(outputs[:, 0], outputs[:, 1], k)["value"])
        if Probe.usable(data.labels):
            probe = Probe(_texts(reference), data.labels, seed=0)
            parts["probe_accuracy"] = row(100.0 * probe.score(_texts(reference))["value"],
                                          100.0 * probe.score(_texts(outputs))["value"])
        return parts

    def budget_points(self, outputs, reference, data):
        if reference is None:
            return "cosine_to_float", 100.0
        parts = self.budget_components(outputs, reference, data)
        # 100 less the worst drop: the float graph scores 100, so the budget's drop is that worst drop
        return f"worst_of({','.join(parts)})", 100.0 - max(0.0, *(p["drop"] for p in parts.values()))

    def skipped_without_baseline(self):
        return f"cosine_to_baseline, neighbour_overlap_at_{NEIGHBOURS} and probe_accuracy"


TASK = FeatureExtraction()
