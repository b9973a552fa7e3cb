"""More text for the teacher to label: an ``unlabeled_data`` file, or augmented copies of the training
texts (``augment`` copies each) when none is given. The student learns the teacher's soft targets on
them (no hard-label term: their label is -100, which the cross-entropy skips).

The augmentation is word-level and label-free, as in EDA (Wei & Zou 2019) and TinyBERT's data
augmentation without its masked-LM replacement step (that needs a second model): per copy, one of
random word deletion (each word with probability 0.15), swaps of random word pairs (one per 10 words),
or a crop that keeps 70-95% of the words at a random offset. The teacher's soft label of the new text
is the target, so a copy whose meaning changed is still a valid lesson. Seeded: the same texts and
seed give the same copies.
"""

from __future__ import annotations

import random
from collections.abc import Sequence


def augmented(texts: Sequence[str], copies: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out: list[str] = []
    for text in texts:
        words = text.split()
        for _ in range(copies):
            new = _one(words, rng) if len(words) >= 3 else list(words)
            candidate = " ".join(new)
            if candidate and candidate != text:
                out.append(candidate)
    return out


def _one(words: list[str], rng: random.Random) -> list[str]:
    kind = rng.randrange(3)
    if kind == 0:
        kept = [w for w in words if rng.random() >= 0.15]
        return kept or [rng.choice(words)]
    if kind == 1:
        new = list(words)
        for _ in range(max(1, len(words) // 10)):
            i, j = rng.randrange(len(new)), rng.randrange(len(new))
            new[i], new[j] = new[j], new[i]
        return new
    keep = max(2, round(len(words) * rng.uniform(0.7, 0.95)))
    start = rng.randrange(len(words) - keep + 1)
    return words[start:start + keep]
