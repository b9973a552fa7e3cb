"""Retrieval recall@k on a held-out pair set: can each text still find its partner?

Cosine to the fp32 embeddings says vectors moved; recall@k says whether the move reorders
neighbours, which is what a search index built on the embeddings sees. Each text is a query against
all the pair texts (its own partner is the one right answer); a hit is the partner ranked in the
top k by cosine, ties counted against the query (a candidate tied with the partner outranks it).
"""

from __future__ import annotations

import numpy as np

from xformopt.scoring.metrics import mean_with_bootstrap, proportion

RECALL_AT = (1, 5)
NEIGHBOURS = 10  # neighbour_overlap's k: the 10 nearest texts an index built on the embeddings would return


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / (np.linalg.norm(x, axis=1, keepdims=True) + 1e-12)


def partner_ranks(queries: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """0-based rank of candidate i among all candidates for query i (by cosine, ties counted against)."""
    # Hand-written (a few lines of numpy): sklearn's top_k_accuracy_score gives the mean only, and the
    # metric needs the per-query hits for its interval.
    sims = _unit(queries) @ _unit(candidates).T
    own = np.diag(sims)
    others = sims >= own[:, None]
    np.fill_diagonal(others, False)
    return others.sum(axis=1)


def recall_at_k(queries: np.ndarray, candidates: np.ndarray, k: int) -> dict:
    """Share of queries whose partner is in the top ``k``: value, n, Wilson ci95, and the pool size."""
    hits = partner_ranks(queries, candidates) < k
    return {**proportion(hits), "k": k, "candidates": len(candidates)}


def nearest(embeddings: np.ndarray, k: int) -> np.ndarray:
    """Each row's ``k`` nearest other rows by cosine (index ties broken by position): (rows, k) indices."""
    sims = _unit(embeddings) @ _unit(embeddings).T
    np.fill_diagonal(sims, -np.inf)
    return np.argsort(-sims, axis=1, kind="stable")[:, :k]


def neighbour_overlap(embeddings: np.ndarray, baseline: np.ndarray, k: int = NEIGHBOURS, seed: int = 0) -> dict | None:
    """Mean share of each text's ``k`` nearest neighbours (among the same texts) that the baseline's embeddings
    also rank among its ``k`` nearest, with a bootstrap 95% interval over texts. Each side ranks in its own
    space, so a student of another width compares too. None with ``k`` or fewer texts."""
    if len(embeddings) <= k:
        return None
    ours, theirs = nearest(embeddings, k), nearest(baseline, k)
    shared = np.array([len(set(a) & set(b)) / k for a, b in zip(ours.tolist(), theirs.tolist())])
    return {**mean_with_bootstrap(shared, seed), "k": k}
