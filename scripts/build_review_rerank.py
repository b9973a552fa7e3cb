"""Build the vendored reranking splits (xformopt/resources/review_rerank/) from the VADER movie-review
snippets already in the package: no download, deterministic (seed 0).

Each query is the first half (by words) of a review snippet; its one relevant passage is the same
snippet's second half; the other passages of its list are second halves of other snippets of the same
split, drawn at random. A reranker must tell which continuation belongs to the opening, which needs the
pair read together (a cross-encoder's strength; a bi-encoder only sees topic and tone). Snippets of fewer
than 12 words are skipped (halves too short to carry anything), and a query is used once.

    python scripts/build_review_rerank.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from xformopt.resources import snippet_halves

ROOT = Path(__file__).resolve().parents[1] / "xformopt" / "resources"
# split -> (queries, passages per list): test and validation lists of 10 score NDCG@10; the train split's
# lists of 4 (one relevant, three others) are the text-ranking task's default training rows (prune, distill)
SPLITS = {"train": (1200, 4), "validation": (60, 10), "test": (120, 10)}
MIN_WORDS = 12


def build(split: str, queries: int, per_list: int, rng: random.Random) -> list[dict]:
    pairs = snippet_halves(split, MIN_WORDS)
    rng.shuffle(pairs)
    chosen, pool = pairs[:queries], [second for _, second in pairs]
    out = []
    for qid, (query, passage) in enumerate(chosen):
        others = rng.sample([p for p in pool if p != passage], per_list - 1)
        candidates = [(passage, 1)] + [(p, 0) for p in others]
        rng.shuffle(candidates)  # the relevant passage's position says nothing
        out += [{"text": query, "text_pair": p, "label": label, "qid": qid} for p, label in candidates]
    return out


def main() -> None:
    rng = random.Random(0)
    folder = ROOT / "review_rerank"
    folder.mkdir(exist_ok=True)
    for split, (queries, per_list) in SPLITS.items():
        rows = build(split, queries, per_list, rng)
        with (folder / f"{split}.jsonl").open("w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        print(f"{split}: {len(rows)} rows, {len(rows) // per_list} queries")


if __name__ == "__main__":
    main()
