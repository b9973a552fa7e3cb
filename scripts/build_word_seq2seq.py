"""Build the vendored ``xformopt/resources/word_seq2seq/`` sets (synthetic, seeded, our own; CC0).

Two text-to-text tasks over a 24-word alphabet (``w0`` ... ``w23``), 3 to 10 words a row:

- ``reverse-*.jsonl``: target = the source's words in reverse order (the translation default);
- ``lead-*.jsonl``: target = the source's first three words (the summarization default: a "lead" summary).

They exist so that ``xformopt optimize`` on an encoder-decoder runs offline with no --data: the tiny
models the test suite builds in code (tests/tiny_seq2seq.py) learn the reverse task in a minute, so
BLEU on it is meaningful for them. They say nothing about a real translation or summarization model:
give such a model your own held-out set (--data FILE with source and target columns).
Run: python scripts/build_word_seq2seq.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = [f"w{i}" for i in range(24)]
SPLITS = {"train": (400, 101), "validation": (100, 202), "test": (100, 303)}
OUT = Path(__file__).resolve().parent.parent / "xformopt" / "resources" / "word_seq2seq"


def rows(n: int, seed: int) -> list[list[str]]:
    rng = random.Random(seed)
    return [[rng.choice(WORDS) for _ in range(rng.randint(3, 10))] for _ in range(n)]


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for split, (n, seed) in SPLITS.items():
        words = rows(n, seed)
        for task, target in (("reverse", lambda w: list(reversed(w))), ("lead", lambda w: w[:3])):
            lines = [json.dumps({"source": " ".join(w), "target": " ".join(target(w))}) for w in words]
            (OUT / f"{task}-{split}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
