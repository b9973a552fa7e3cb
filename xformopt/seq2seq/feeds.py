"""The two graphs' real inputs, recorded while the float graphs generate: what static INT8 calibrates each
graph on and what the outlier rules measure activation ranges on.

The decoder graph's inputs exist only during generation (a step's past is the previous step's output),
so they are recorded from the runner itself, not built from texts. Every start is kept; decoder steps
are a seeded reservoir sample of at most ``max_decoder_feeds`` (a batch of sentences takes one step per
generated token: the past of every step of a long calibration set would not fit in memory).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from xformopt.seq2seq.generate import GenerationSettings
from xformopt.seq2seq.measure import generate_rows
from xformopt.seq2seq.runner import Cache, OrtSeq2Seq

DECODER_FEEDS = 256  # decoder steps kept for calibration: a few hundred spans early and late positions


class RecordingSeq2Seq(OrtSeq2Seq):
    """An :class:`OrtSeq2Seq` that keeps the feeds it runs (the runner's own feed builders)."""

    def __init__(self, path: str | Path, threads: int | None = None, max_decoder_feeds: int = DECODER_FEEDS,
                 seed: int = 0):
        super().__init__(path, threads)
        self.encoder_feeds: list[dict[str, np.ndarray]] = []
        self.decoder_feeds: list[dict[str, np.ndarray]] = []
        self.decoder_steps = 0
        self.max_decoder_feeds = max_decoder_feeds
        self._rng = np.random.default_rng(seed)

    def start(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> tuple[np.ndarray, Cache]:
        self.encoder_feeds.append(self.encoder_feed(input_ids, attention_mask))
        return super().start(input_ids, attention_mask)

    def step(self, tokens: np.ndarray, cache: Cache) -> tuple[np.ndarray, Cache]:
        self._keep(self.decoder_feed(tokens, cache))
        return super().step(tokens, cache)

    def _keep(self, feed: dict[str, np.ndarray]) -> None:
        """Reservoir sampling (Algorithm R): every step seen so far equally likely to be kept."""
        self.decoder_steps += 1
        if len(self.decoder_feeds) < self.max_decoder_feeds:
            self.decoder_feeds.append(feed)
            return
        slot = int(self._rng.integers(self.decoder_steps))
        if slot < self.max_decoder_feeds:
            self.decoder_feeds[slot] = feed


@dataclass
class RecordedFeeds:
    encoder: list[dict[str, np.ndarray]]
    decoder: list[dict[str, np.ndarray]]
    decoder_steps: int  # steps generated; ``decoder`` holds a sample of them

    def record(self) -> dict:
        return {"encoder_feeds": len(self.encoder), "decoder_feeds": len(self.decoder),
                "decoder_steps_seen": self.decoder_steps}


def record_feeds(path: Path, tokenizer, texts: Sequence[str], settings: GenerationSettings, *, batch_size: int,
                 max_decoder_feeds: int = DECODER_FEEDS, threads: int | None = None) -> RecordedFeeds:
    """The feeds of both graphs while the stage at ``path`` generates ``texts`` greedily, ``batch_size`` at a time."""
    runner = RecordingSeq2Seq(path, threads, max_decoder_feeds)
    generate_rows(runner, tokenizer, texts, settings, batch_size=batch_size)
    return RecordedFeeds(runner.encoder_feeds, runner.decoder_feeds, runner.decoder_steps)
