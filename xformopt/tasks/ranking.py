"""text-ranking: a cross-encoder reranker, a sequence-classification model with one output that scores a
(query, passage) pair, as sentence-transformers' ``CrossEncoder`` and TEI's rerank route use it (TEI
tells a reranker from a classifier the same way: one label). Metrics on held-out query lists: NDCG@10
(the headline) and MRR@10 against the rows' relevance labels, and top-1 agreement with the PyTorch fp32
baseline (xformopt/scoring/ranking.py). Default rows: the vendored ``review_rerank`` lists
(xformopt/resources/review_rerank/README.md), never the sentiment labels a classifier is scored on.

INT8 budget (``max_accuracy_drop``): NDCG@10 in points where the budget rows are labelled, else the
score agreement with the float graph.
"""

from __future__ import annotations

import numpy as np

from xformopt.errors import InputError
from xformopt.resources import review_rerank_path
from xformopt.scoring.metrics import mean_with_bootstrap
from xformopt.scoring.ranking import mrr_at_k, ndcg_at_k, per_query_ndcg, query_lists, top1_agreement
from xformopt.tasks.base import Metric, Task
from xformopt.tasks.classification import ClassificationHead, is_reranker
from xformopt.tasks.heads import Serving


class TextRanking(Task):
    name = "text-ranking"
    # [{label, score}] per pair, the score the sigmoid of the one logit (raw_scores: the logit), as TEI's
    # /predict answers a reranker; /rerank orders a query's passages by it
    head = ClassificationHead
    serving = Serving(routes=("/predict", "/rerank"), main="/rerank", kind="rerank", body="ClassifyRequest",
                      options=("truncate", "raw_scores"), two_texts_are_a_pair=True,
                      warmup=lambda text: (text, text))
    summary = "reranking: one relevance score per (query, passage) pair (a cross-encoder)"
    auto_model = "AutoModelForSequenceClassification"
    export_outputs = ("logits",)
    architectures = ("ForSequenceClassification",)
    headline = "ndcg_at_10"
    metrics = {"ndcg_at_10": Metric("NDCG@10"), "mrr_at_10": Metric("MRR@10"),
               "top1_agreement": Metric("Top-1 agreement", percent=True, relative=True)}
    needs_labels = True
    passes = ("export", "fuse", "quantize")
    agreement_measure = "pairwise order agreement of the scores"

    def claims(self, config: dict) -> bool:
        return super().claims(config) and is_reranker(config)

    def default_data(self, split):
        return review_rerank_path(split)

    def load(self, path, *, label2id, limit, seed, columns=None, require_labels=None):
        data = super().load(path, label2id=None, limit=limit, seed=seed, columns=columns,
                            require_labels=require_labels)
        if data.text_pairs is None:
            raise InputError(f"{path}: a text-ranking model needs (query, passage) rows: a text column, a text_pair "
                             "column and a relevance label (rows with the same query form its list)")
        return data

    def score(self, outputs, baseline, data, seed=0):
        lists = query_lists(data.texts)
        scores = np.asarray(outputs).reshape(len(data.texts), -1)[:, 0]
        metrics = {}
        if data.labels is not None:
            labels = np.asarray(data.labels)
            metrics = {"ndcg_at_10": ndcg_at_k(scores, labels, lists, seed=seed),
                       "mrr_at_10": mrr_at_k(scores, labels, lists, seed=seed)}
        if baseline is not None:
            agree = top1_agreement(scores, np.asarray(baseline).reshape(len(data.texts), -1)[:, 0], lists)
            metrics["top1_agreement"] = mean_with_bootstrap(agree, seed)
        return metrics

    def agreement(self, outputs, reference):
        """Per row, the share of other rows (up to 512, evenly spaced) that both score sets order the same way
        against it: a reranker's scores matter only by their order, and a row's concordance is in [0, 1]."""
        outputs, reference = np.asarray(outputs, np.float64).reshape(-1), np.asarray(reference, np.float64).reshape(-1)
        others = np.unique(np.linspace(0, len(outputs) - 1, min(len(outputs), 512)).astype(int))
        same = np.sign(outputs[:, None] - outputs[others]) == np.sign(reference[:, None] - reference[others])
        mine = others[None, :] == np.arange(len(outputs))[:, None]  # a row against itself says nothing
        return (same & ~mine).sum(1) / np.maximum((~mine).sum(1), 1)

    def budget_points(self, outputs, reference, data):
        if data.labels is not None:
            values = per_query_ndcg(np.asarray(outputs).reshape(-1), np.asarray(data.labels), query_lists(data.texts))
            return "ndcg_at_10", 100.0 * float(values.mean())
        if reference is None:
            return "agreement_with_float", 100.0
        return "agreement_with_float", 100.0 * float(np.mean(self.agreement(outputs, reference)))

    def skipped_without_baseline(self):
        return "top1_agreement"


TASK = TextRanking()
