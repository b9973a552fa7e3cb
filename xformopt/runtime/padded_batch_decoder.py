"""Continuous batching for the plain dynamo export's decoders (Qwen3.5 and any graph that takes
``attention_mask`` and ``position_ids`` with a split cache, but no GroupQueryAttention): the engine
``xformopt serve`` uses for them, with :class:`~xformopt.runtime.batch_decoder.BatchDecoder`'s interface.

Such a graph takes a rectangular past, so rows of different lengths are *left*-padded: the decoding rows'
key/value tensors share one width ``W`` (the longest row), a row of length ``n`` holds its positions in
``[W - n, W)``, its mask row is zeros then ones, and its position id is ``n`` (the graph's rotary reads
it), which is how the export's parity check already runs a left-padded batch. A linear-attention layer's
conv/recurrent states are fixed-size per row: they stack with no padding at all. The step's present is the
next step's past, so nothing is copied while the rows stay the same; a newcomer (its prompt read alone,
batch 1, by the single-stream runner, in chunks) is padded into the batch, and a leaving row is dropped
and the columns no row needs any more are cut. Greedy answers equal the single-stream runner's
(``tests/serve/test_serve_unbatched.py``).

Cost: attention runs over ``W`` positions for every row (the padding is computed, then masked), and
memory is ``rows x W``: :meth:`fits` counts every row at the longest reservation, as BatchDecoder does.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from xformopt.errors import InputError
from xformopt.runtime.decoder import SPLIT, _gqa_max_positions, is_state
from xformopt.runtime.serial_decoder import SerialDecoder, SerialSlot

LENGTH_AXIS = 2  # (rows, heads, positions, head_dim) for a split cache's key/value


def left_padded_batchable(model_dir: Path) -> bool:
    """Whether left-padded rows can share a call: a split cache, the mask and position ids as inputs (the
    plain dynamo export); GroupQueryAttention graphs batch in BatchDecoder instead."""
    import onnx

    model_path = Path(model_dir) / "model.onnx"
    names = {i.name for i in onnx.load(model_path, load_external_data=False).graph.input}
    return ({"attention_mask", "position_ids"} <= names and any(n.startswith("past_key_values.") for n in names)
            and _gqa_max_positions(model_path) is None)


class PaddedBatchDecoder(SerialDecoder):
    """Prefill per sequence on the single-stream runner (inherited); decode every decoding row in one call."""

    def __init__(self, model_dir: Path, threads: int | None = None, max_kv_tokens: int = 8192, max_rows: int = 16):
        super().__init__(model_dir, threads, max_kv_tokens, max_rows)
        if not left_padded_batchable(self.model_dir) or self.runner.layout.kind != SPLIT:
            raise InputError(f"{self.model_dir}: left-padded batching needs the plain dynamo export's inputs "
                             "(attention_mask, position_ids, past_key_values.*)")
        self.batch: dict[str, np.ndarray] = {}  # the decoding rows' past, left-padded to ``width``
        self.width = 0

    @property
    def allocated_positions(self) -> int:
        return len(self.decoding) * self.width + sum(s.length for s in self.prefilling)

    def fits(self, reserved: int) -> bool:
        current = [s.reserved for s in self.slots] + [reserved]
        return (len(current) <= self.max_rows and (not self.max_positions or reserved <= self.max_positions)
                and len(current) * max(current) <= self.max_kv_tokens)

    def start_decoding(self, slot: SerialSlot) -> None:
        """The slot's cache joins the batch as its last row (the batch or the row padded on the left)."""
        super().start_decoding(slot)
        cache = {n: v if isinstance(v, np.ndarray) else v.numpy() for n, v in slot.state.cache.items()}
        slot.state = None  # the batch holds it now
        width = max(self.width, slot.length)
        joined = {}
        for name in self.runner.layout.past_names:
            row = cache[name]
            if not self.batch:  # the first decoding row
                joined[name] = _left_pad(row, width, name)
            else:
                joined[name] = np.concatenate([_left_pad(self.batch[name], width, name), _left_pad(row, width, name)])
        self.batch, self.width = joined, width

    def decode(self, tokens) -> np.ndarray:
        """One step of every decoding row in one call; (rows, vocab) logits."""
        self.check_decode(tokens)
        count = len(self.decoding)
        lengths = np.array([s.length for s in self.decoding], dtype=np.int64)
        mask = (np.arange(self.width + 1)[None, :] >= (self.width - lengths)[:, None]).astype(np.int64)
        layout = self.runner.layout
        feed = {"input_ids": np.asarray(tokens, dtype=np.int64).reshape(count, 1), "attention_mask": mask,
                "position_ids": lengths.reshape(count, 1), **self.batch}
        outputs = self.runner.session.run(["logits", *layout.present_names], feed)
        self.batch = dict(zip(layout.past_names, outputs[1:]))
        self.width += 1
        for s in self.decoding:
            s.length += 1
        self.runner.tokens_processed += count
        self.calls["decode"] += 1
        return outputs[0][:, -1]

    def close(self, slot: SerialSlot) -> None:
        """A decoding row leaves the batch; the columns only it needed are cut."""
        if slot in self.decoding:
            row = self.decoding.index(slot)
            keep = [i for i in range(len(self.decoding)) if i != row]
            width = max((self.decoding[i].length for i in keep), default=0)
            self.batch = {n: _trim(a[keep], width, n) for n, a in self.batch.items()} if keep else {}
            self.width = width
        super().close(slot)


def _left_pad(array: np.ndarray, width: int, name: str) -> np.ndarray:
    """A key/value tensor zero-padded on the left of its positions to ``width``; a state as it is."""
    missing = width - array.shape[LENGTH_AXIS]
    if is_state(name) or missing <= 0:
        return array
    pad = [(0, 0)] * array.ndim
    pad[LENGTH_AXIS] = (missing, 0)
    return np.pad(array, pad)


def _trim(array: np.ndarray, width: int, name: str) -> np.ndarray:
    """The last ``width`` positions of a key/value tensor (contiguous); a state as it is."""
    if is_state(name):
        return np.ascontiguousarray(array)
    return np.ascontiguousarray(array[:, :, array.shape[LENGTH_AXIS] - width:])
