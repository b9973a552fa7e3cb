"""Fixtures of the encoder-decoder tests: the tiny models trained on the reverse task, trained once per run and
shared by every module (and pytest-xdist worker) that reads them."""

from __future__ import annotations

from pathlib import Path

import pytest
from run_shared import run_shared
from tiny_seq2seq import build_seq2seq


@pytest.fixture(scope="session")
def trained_bart_src(tmp_path_factory) -> Path:
    """A tiny BART trained 300 seeded steps to reverse word sequences (~15 s on one core): read it, never write it."""
    return run_shared(tmp_path_factory, "bart-reverse-300", lambda folder: build_seq2seq(folder, "bart", train_steps=300))


@pytest.fixture(scope="session")
def trained_t5_src(tmp_path_factory) -> Path:
    """A tiny T5 trained 300 seeded steps on the reverse task (~15 s on one core): read it, never write it."""
    return run_shared(tmp_path_factory, "t5-reverse-300", lambda folder: build_seq2seq(folder, "t5", train_steps=300))
