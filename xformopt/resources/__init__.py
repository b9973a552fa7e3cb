"""Data files shipped inside the package (plain folders, not subpackages).

``vader_movie/``: binary movie-review sentiment splits built by
``scripts/build_vader_dataset.py``; see ``vader_movie/README.md`` for provenance.
``vader_polarity_tags/``: word-level B-POS/B-NEG/O tags (a lexicon lookup of human word ratings) on
the same snippets, built by ``scripts/build_vader_polarity_tags.py``; see its README.md.
``review_rerank/``: query-passage lists (a snippet's first half, its own second half among others) for
rerankers, built by ``scripts/build_review_rerank.py``; see its README.md.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

VADER_SPLITS = ("train", "validation", "test")

# Resolved from this file rather than the CWD, so it works from a checkout and from an
# installed wheel alike (the package must ship ``resources/vader_movie/*`` as package data).
_ROOT = Path(__file__).resolve().parent


def vader_split_path(split: str) -> Path:
    """Path of the vendored ``vader_movie/<split>.jsonl`` file."""
    if split not in VADER_SPLITS:
        raise ValueError(f"unknown split {split!r}; valid splits: {', '.join(VADER_SPLITS)}")
    return _ROOT / "vader_movie" / f"{split}.jsonl"


def review_rerank_path(split: str) -> Path:
    """Path of the vendored ``review_rerank/<split>.jsonl`` file (query, passage, relevance rows)."""
    if split not in VADER_SPLITS:
        raise ValueError(f"unknown split {split!r}; valid splits: {', '.join(VADER_SPLITS)}")
    return _ROOT / "review_rerank" / f"{split}.jsonl"


def polarity_tags_path(split: str) -> Path:
    """Path of the vendored ``vader_polarity_tags/<split>.jsonl`` file (tokens + tags per line)."""
    if split not in VADER_SPLITS:
        raise ValueError(f"unknown split {split!r}; valid splits: {', '.join(VADER_SPLITS)}")
    return _ROOT / "vader_polarity_tags" / f"{split}.jsonl"


SEQ2SEQ_SETS = ("reverse", "lead")


def word_seq2seq_path(task: str, split: str) -> Path:
    """Path of a vendored synthetic text-to-text split (``word_seq2seq/<task>-<split>.jsonl``)."""
    if task not in SEQ2SEQ_SETS or split not in VADER_SPLITS:
        raise ValueError(f"unknown word_seq2seq set {task}-{split}; sets: {SEQ2SEQ_SETS}, splits: {VADER_SPLITS}")
    return _ROOT / "word_seq2seq" / f"{task}-{split}.jsonl"


def snippet_halves(split: str, min_words: int = 12) -> list[tuple[str, str]]:
    """(first half, second half) by words of every ``vader_movie/<split>`` snippet of at least ``min_words``
    words (HTML unescaped; a repeated opening kept once, in file order): the query and its relevant passage of
    ``review_rerank``, and what a reranker trains on (examples/rerank)."""
    pairs: dict[str, str] = {}
    for line in vader_split_path(split).open(encoding="utf-8"):
        words = html.unescape(json.loads(line)["text"]).split()
        if len(words) >= min_words:
            cut = len(words) // 2
            pairs.setdefault(" ".join(words[:cut]), " ".join(words[cut:]))
    return list(pairs.items())
