"""The engine ``xformopt serve`` falls back to for a decoder graph that neither batching engine takes (no
GroupQueryAttention for :mod:`.batch_decoder`, no ``attention_mask``/``position_ids`` split cache for
:mod:`.padded_batch_decoder`: GPT-2's own layout). It speaks :class:`~xformopt.runtime.batch_decoder.BatchDecoder`'s
interface (``open``/``prefill``/``start_decoding``/``decode``/``close``), so the serve scheduler, its
queue bounds, 503s and SIGTERM drain stay the same code, but each sequence runs on its own
:class:`~xformopt.runtime.decoder.OrtDecoder` state, batch 1: the runner ``xformopt generate`` uses, so
an answer is the single-stream answer by construction. Serve opens it with one row: requests are
queued and run one at a time. With more rows, ``decode`` runs the rows one after another (turns, not a
batch): nothing is gained in throughput, it only lets short requests pass long ones.

Memory is bounded as in the batch engine: the open sequences' reservations (prompt + the most new
tokens each may take) stay within ``max_kv_tokens``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from xformopt.runtime.decoder import OrtDecoder
from xformopt.runtime.sequence_book import SequenceBook


@dataclass(eq=False)
class SerialSlot:
    """One sequence: its reservation and its own runner state."""

    reserved: int
    state: Any = None
    length: int = 0  # positions cached
    decoding: bool = False


class SerialDecoder(SequenceBook):
    """One :class:`OrtDecoder` session whose sequences each keep their own cache (no shared buffer).
    Not thread-safe: one thread drives it (the scheduler's engine thread)."""

    def __init__(self, model_dir: Path, threads: int | None = None, max_kv_tokens: int = 8192, max_rows: int = 1):
        self.start_book(max_kv_tokens, max_rows)
        self.model_dir = Path(model_dir)
        self.runner = OrtDecoder(self.model_dir, threads=threads)
        self.max_positions = self.runner.max_positions  # None: the graph has no rotary table (the config bounds it)

    @property
    def allocated_positions(self) -> int:
        return self.cached_positions  # each cache holds its own positions only (no padding)

    def fits(self, reserved: int) -> bool:
        current = sum(s.reserved for s in self.slots)
        return (len(self.slots) < self.max_rows and (not self.max_positions or reserved <= self.max_positions)
                and current + reserved <= self.max_kv_tokens)

    def open(self, reserved: int) -> SerialSlot:
        self.check_open(reserved)
        slot = SerialSlot(int(reserved))
        self.prefilling.append(slot)
        return slot

    def prefill(self, slot: SerialSlot, ids) -> np.ndarray:
        """Read ``ids`` (the next part of the prompt) after the slot's state; its last position's logits."""
        ids = np.asarray(ids, dtype=np.int64).reshape(1, -1)
        self.check_prefill(slot, ids.shape[1])
        logits, slot.state = self.runner.forward(ids, slot.state, last_only=True)
        slot.length += ids.shape[1]
        self.calls["prefill"] += 1
        return logits[0, -1]

    def start_decoding(self, slot: SerialSlot) -> None:
        self.check_start(slot)
        self.prefilling.remove(slot)
        slot.decoding = True
        self.decoding.append(slot)

    def decode(self, tokens) -> np.ndarray:
        """One step of every decoding sequence, each its own batch-1 call; (rows, vocab) logits."""
        self.check_decode(tokens)
        rows = []
        for slot, token in zip(self.decoding, tokens):
            logits, slot.state = self.runner.forward(np.array([[token]], dtype=np.int64), slot.state, last_only=True)
            slot.length += 1
            rows.append(logits[0, -1])
        self.calls["decode"] += 1
        return np.stack(rows)

    def close(self, slot: SerialSlot) -> None:
        for group in (self.decoding, self.prefilling):
            if slot in group:
                group.remove(slot)
        slot.state, slot.decoding = None, False  # the cache goes with the state
