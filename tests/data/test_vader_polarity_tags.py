"""The vendored vader_polarity_tags set: it reads as token-classification data, its tags follow the
documented lookup rule (one tag per lowercased word, everywhere), its splits are disjoint and it
stays small enough to ship."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from xformopt.resources import VADER_SPLITS, polarity_tags_path, vader_split_path
from xformopt.tasks.token_data import load_tagged

TAGS = {"O": 0, "B-POS": 1, "B-NEG": 2}
SIZES = {"train": 3000, "validation": 500, "test": 1000}


def rows(split: str) -> list[dict]:
    return [json.loads(line) for line in polarity_tags_path(split).read_text(encoding="utf-8").splitlines()]


@pytest.mark.parametrize("split", VADER_SPLITS)
def test_split_loads_as_tagged_sentences(split):
    data = load_tagged(polarity_tags_path(split), label2id=TAGS, require_labels=True)
    assert len(data) == SIZES[split]
    assert all(len(w) == len(t) for w, t in zip(data.extra["words"], data.extra["tags"]))
    counts = {i: sum(t.count(i) for t in data.extra["tags"]) for i in TAGS.values()}
    assert all(counts.values())  # every tag occurs in every split


def test_tags_are_a_function_of_the_lowercased_word_and_splits_are_disjoint():
    tag_of: dict[str, str] = {}
    ids = {}
    for split in VADER_SPLITS:
        ids[split] = {r["id"] for r in rows(split)}
        for row in rows(split):
            assert 0 < len(row["tokens"]) <= 40
            for word, tag in zip(row["tokens"], row["tags"], strict=True):
                assert tag_of.setdefault(word.lower(), tag) == tag, word
    assert not (ids["train"] & ids["test"]) and not (ids["train"] & ids["validation"])
    assert not (ids["validation"] & ids["test"])
    for word in ("good", "great", "funny"):
        assert tag_of[word] == "B-POS"
    for word in ("bad", "worst", "dull"):
        assert tag_of[word] == "B-NEG"
    assert tag_of["the"] == tag_of["movie"] == "O"


def test_sentences_are_in_the_same_split_as_in_vader_movie():
    for split in VADER_SPLITS:
        movie = {json.loads(line)["id"] for line in vader_split_path(split).read_text(encoding="utf-8").splitlines()}
        assert {r["id"] for r in rows(split)} <= movie


def test_vendored_folder_is_small_and_packaged():
    folder = polarity_tags_path("test").parent
    assert sum(p.stat().st_size for p in folder.iterdir()) < 2_000_000
    assert {p.name for p in folder.iterdir()} >= {"LICENSE", "README.md", "train.jsonl", "validation.jsonl", "test.jsonl"}
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert re.search(r'"resources/\*/\*\.jsonl"', pyproject)
