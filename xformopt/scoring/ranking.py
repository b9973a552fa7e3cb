"""Ranking metrics of a reranker on query lists: NDCG@k and MRR@k, per query, then their mean with a
bootstrap interval over queries.

A held-out ranking set is flat (query, passage, relevance) rows; a query's list is every row with the same
query text (:func:`query_lists`), wherever it sits in the file, so a seeded sample of rows still scores.
NDCG is scikit-learn's (``ndcg_score``, ties averaged over their orders); MRR is the reciprocal rank of the
first relevant passage within the top k, ties counted against the query (as recall@k does), 0 beyond k.
Lists with fewer than two passages or no relevant one say nothing about the order and are left out.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from xformopt.scoring.metrics import mean_with_bootstrap

AT_K = 10


def query_lists(queries: Sequence[str]) -> list[np.ndarray]:
    """Row indices of each distinct query, in first-seen order."""
    lists: dict[str, list[int]] = {}
    for i, query in enumerate(queries):
        lists.setdefault(query, []).append(i)
    return [np.asarray(rows) for rows in lists.values()]


def _scored(lists: list[np.ndarray], labels: np.ndarray) -> list[np.ndarray]:
    return [rows for rows in lists if len(rows) > 1 and (labels[rows] > 0).any()]


def per_query_ndcg(scores: np.ndarray, labels: np.ndarray, lists: list[np.ndarray], k: int = AT_K) -> np.ndarray:
    from sklearn.metrics import ndcg_score

    scores, labels = np.asarray(scores, dtype=np.float64).reshape(-1), np.asarray(labels, dtype=np.float64)
    return np.array([ndcg_score(labels[rows][None], scores[rows][None], k=k) for rows in _scored(lists, labels)])


def per_query_rr(scores: np.ndarray, labels: np.ndarray, lists: list[np.ndarray], k: int = AT_K) -> np.ndarray:
    scores, labels = np.asarray(scores, dtype=np.float64).reshape(-1), np.asarray(labels)
    out = []
    for rows in _scored(lists, labels):
        s, relevant = scores[rows], labels[rows] > 0
        best = s[relevant].max()
        rank = int((s[~relevant] >= best).sum()) + 1  # ties against the query
        out.append(1.0 / rank if rank <= k else 0.0)
    return np.array(out)


def ndcg_at_k(scores, labels, lists, k: int = AT_K, seed: int = 0) -> dict:
    return {**mean_with_bootstrap(per_query_ndcg(scores, labels, lists, k), seed), "k": k}


def mrr_at_k(scores, labels, lists, k: int = AT_K, seed: int = 0) -> dict:
    return {**mean_with_bootstrap(per_query_rr(scores, labels, lists, k), seed), "k": k}


def top1_agreement(scores: np.ndarray, reference: np.ndarray, lists: list[np.ndarray]) -> np.ndarray:
    """Per list: 1.0 where both score sets put the same passage first."""
    scores, reference = np.asarray(scores).reshape(-1), np.asarray(reference).reshape(-1)
    return np.array([float(np.argmax(scores[rows]) == np.argmax(reference[rows])) for rows in lists if len(rows) > 1])
