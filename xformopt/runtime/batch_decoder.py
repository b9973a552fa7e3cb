"""Many sequences of different lengths decoded in one ONNX Runtime call per step: the engine under
continuous batching (``xformopt serve`` for decoders).

The GroupQueryAttention graphs (onnxruntime-genai's builder) take no position ids: each row's length
comes from its attention mask (``seqlens_k = sum(mask) - 1``, the call's total length is the mask's
width), and with the past and present bound to one buffer (``past_present_share_buffer``) the kernel
reads and writes each row at its own offset, rotary positions included. So rows of different lengths
share a call as long as the cache is *right*-padded: one buffer per past/present pair, shaped
``(rows, kv_heads, capacity, head_dim)``, row ``r`` holding its sequence's keys and values in
positions ``[0, length)``, and a mask row of ``length + 1`` ones then zeros. Attention per row costs
its own length, not the longest row's.

Rows: the decoding sequences sit in rows ``[0, d)`` (so a decode step binds one contiguous view of the
buffer), sequences still reading their prompt right after them. A prompt is read in its own call, on
its row alone (batch 1, a view of that row), in chunks: the kernel continues a row from its past
length, so a long prompt can be read a chunk at a time between decode steps. When a sequence leaves,
the last decoding row is copied into its place (one row's live positions), so rows stay contiguous.

Memory is bounded: the buffer holds at most ``max_kv_tokens`` positions (rows x capacity) and grows
only when a newcomer needs it. The caller asks :meth:`BatchDecoder.fits` before adding a sequence:
with right padding every row is as long as the longest reservation, so the cost of a set of
sequences is ``rows x their longest reservation`` (prompt + the most new tokens each may take).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from xformopt.errors import InputError
from xformopt.runtime import last_logits
from xformopt.runtime.decoder import SPLIT, CacheLayout, _gqa_max_positions, is_state
from xformopt.runtime.sequence_book import SequenceBook
from xformopt.runtime.session import DECODER_SPIN_US, ort_session


def unbatchable_reason(model_dir: Path) -> str | None:
    """None when this engine can batch the decoder in ``model_dir``, else why not (one line, no path): serve
    then batches left-padded rows (:mod:`.padded_batch_decoder`) or runs one sequence at a time
    (:mod:`.serial_decoder`)."""
    model_path = Path(model_dir) / "model.onnx"
    if _gqa_max_positions(model_path):
        return None
    import onnx

    states = [i.name for i in onnx.load(model_path, load_external_data=False).graph.input if is_state(i.name)]
    if states:
        return (f"the graph carries linear-attention states ({states[0]}, ...: fixed-size per sequence, no place "
                "in the shared KV buffer, e.g. Qwen3.5's Gated DeltaNet layers)")
    return ("continuous batching needs a GroupQueryAttention graph with its rotary table, and this one has none "
            "(GPT-2's own layout, the plain dynamo export, or an older export)")


QUANTUM = 64  # positions a buffer's capacity is rounded up to, so growth reallocates rarely


@dataclass(eq=False)
class Slot:
    """One sequence's row in the shared cache."""

    reserved: int  # positions it may grow to: prompt + the most new tokens it may take
    row: int = -1
    length: int = 0  # positions cached
    decoding: bool = False


class BatchDecoder(SequenceBook):
    """An ONNX Runtime GroupQueryAttention decoder whose cache rows belong to separate sequences.

    ``open(reserved)`` adds a sequence, ``prefill(slot, ids)`` reads (part of) its prompt,
    ``start_decoding(slot)`` moves it among the decoding rows, ``decode(tokens)`` runs one step of
    every decoding row, ``close(slot)`` frees its row. Not thread-safe: one thread drives it."""

    def __init__(self, model_dir: Path, threads: int | None = None, max_kv_tokens: int = 8192, max_rows: int = 16,
                 last_position_logits: bool = True):
        self.model_dir = Path(model_dir)
        self.start_book(max_kv_tokens, max_rows)
        self.max_positions = _gqa_max_positions(self.model_dir / "model.onnx")
        if not self.max_positions:
            raise InputError(f"{self.model_dir}: cannot be batched continuously: {unbatchable_reason(self.model_dir)}")
        # A prompt step needs the last position's logits only (runtime/last_logits.py): the head runs on one
        # position instead of the whole prompt.
        graph = last_logits.rewritten(self.model_dir) if last_position_logits else None
        self.last_position_logits = graph is not None
        self.session = ort_session(graph or self.model_dir / "model.onnx", threads, external_data_dir=self.model_dir,
                                   spinning=True, spin_us=DECODER_SPIN_US)
        self.layout = CacheLayout.from_session(self.session)
        if self.layout.kind != SPLIT or not self.layout.has_attention_mask or self.layout.has_position_ids:
            raise InputError(f"{self.model_dir}: expected the builder's inputs (input_ids, attention_mask, "
                             "past_key_values.*), found another layout; re-export the decoder")
        # (kv_heads, head_dim) per cache tensor: layers may differ (Gemma 4's full-attention layers)
        self.heads = {n: (s[1], s[3]) for n, s in zip(self.layout.past_names, self.layout.past_shapes)}
        if not all(isinstance(d, int) for dims in self.heads.values() for d in dims):
            raise InputError(f"{self.model_dir}: the cache's head axes are not static ({self.layout.past_shapes}); "
                             "re-export the decoder")
        self.bytes_per_position = np.dtype(self.layout.past_dtype).itemsize * sum(h * d for h, d in self.heads.values())
        self.arrays: dict[str, np.ndarray] = {}
        self.rows_allocated = self.capacity = 0
        self._views: dict[tuple[int, int], tuple] = {}

    # ------------------------------------------------------------------ accounting

    @property
    def allocated_positions(self) -> int:
        return self.rows_allocated * self.capacity

    def cost(self, reservations: list[int]) -> int:
        """Positions a right-padded buffer needs for sequences with these reservations."""
        return len(reservations) * max(reservations, default=0)

    def fits(self, reserved: int) -> bool:
        """Whether one more sequence reserving ``reserved`` positions fits beside the open ones."""
        current = [s.reserved for s in self.slots]
        return (len(current) < self.max_rows and reserved <= self.max_positions
                and self.cost(current + [reserved]) <= self.max_kv_tokens)

    # ------------------------------------------------------------------ sequences

    def open(self, reserved: int) -> Slot:
        self.check_open(reserved)
        slot = Slot(int(reserved), row=len(self.slots))
        self.prefilling.append(slot)
        self._ensure(len(self.slots), max(s.reserved for s in self.slots))
        return slot

    def prefill(self, slot: Slot, ids) -> np.ndarray:
        """Read ``ids`` (the next part of the prompt) on the slot's row; the logits of its last position."""
        ids = np.asarray(ids, dtype=np.int64).reshape(1, -1)
        self.check_prefill(slot, ids.shape[1])
        mask = np.ones((1, slot.length + ids.shape[1]), dtype=np.int64)
        logits = self._run(ids, mask, slot.row, slot.row + 1)
        slot.length += ids.shape[1]
        self.calls["prefill"] += 1
        return logits[0, -1]

    def start_decoding(self, slot: Slot) -> None:
        """Move a sequence whose prompt is read among the decoding rows (row ``d``)."""
        self.check_start(slot)
        first = self.prefilling[0]
        if first is not slot:  # swap rows so the decoding rows stay [0, d)
            self._swap_rows(first, slot)
            i = self.prefilling.index(slot)
            self.prefilling[0], self.prefilling[i] = slot, first
        self.prefilling.pop(0)
        slot.decoding = True
        self.decoding.append(slot)

    def decode(self, tokens) -> np.ndarray:
        """One step of every decoding row: ``tokens[i]`` is fed to ``self.decoding[i]``; (rows, vocab) logits."""
        self.check_decode(tokens)
        count = len(self.decoding)
        lengths = np.array([s.length for s in self.decoding], dtype=np.int64)
        if int(lengths.max()) + 1 > self.capacity:
            raise ValueError("a row would grow past its reservation")
        width = int(lengths.max()) + 1
        mask = (np.arange(width)[None, :] <= lengths[:, None]).astype(np.int64)
        logits = self._run(np.asarray(tokens, dtype=np.int64).reshape(count, 1), mask, 0, count)
        for s in self.decoding:
            s.length += 1
        self.calls["decode"] += 1
        return logits[:, -1]

    def close(self, slot: Slot) -> None:
        """Free the slot's row; the last row of its group moves into it (and the prefilling rows follow)."""
        group = self.decoding if slot.decoding else self.prefilling
        if slot not in group:
            return
        i = group.index(slot)
        last = group[-1]
        if last is not slot:
            self._copy_row(last, slot.row)
            group[i] = last
        group.pop()
        if slot.decoding:  # the prefilling rows shift down by one to stay right after the decoding rows
            for p in self.prefilling:
                self._copy_row(p, p.row - 1)
        slot.row, slot.decoding = -1, False

    # ------------------------------------------------------------------ the buffer

    def _ensure(self, rows: int, positions: int) -> None:
        """Rows and capacity for ``rows`` sequences of up to ``positions`` each, within the bound."""
        if rows <= self.rows_allocated and positions <= self.capacity:
            return
        want_rows = min(self.max_rows, max(rows, 2 * self.rows_allocated))
        want_cap = min(self.max_positions, max(positions, -(-positions // QUANTUM) * QUANTUM, self.capacity))
        while want_rows * want_cap > self.max_kv_tokens and want_rows > rows:
            want_rows -= 1
        if want_rows * want_cap > self.max_kv_tokens:
            want_cap = max(positions, self.max_kv_tokens // want_rows)
        if want_rows * want_cap > self.max_kv_tokens:  # fits() was not asked
            raise InputError(f"{rows} rows of {positions} positions exceed max_kv_tokens {self.max_kv_tokens}")
        arrays = {n: np.zeros((want_rows, heads, want_cap, dim), dtype=self.layout.past_dtype)
                  for n, (heads, dim) in self.heads.items()}
        live = max((s.length for s in self.slots), default=0)
        if self.arrays and live:  # the open rows' cached positions move over
            keep_rows = min(self.rows_allocated, want_rows, max(s.row for s in self.slots) + 1)
            for name, old in self.arrays.items():
                arrays[name][:keep_rows, :, :live] = old[:keep_rows, :, :live]
        self.arrays, self.rows_allocated, self.capacity = arrays, want_rows, want_cap
        self._views.clear()

    def _binding(self, start: int, stop: int):
        """An IOBinding with rows [start, stop) of every buffer bound as past and present (OrtValues viewing
        the buffer, no copy), cached until the buffer changes: a step re-binds only its inputs and logits.
        Logits are bound first, so they stay the first output."""
        import onnxruntime as ort

        key = (start, stop)
        if key not in self._views:
            binding = self.session.io_binding()
            binding.bind_output("logits", "cpu")
            values = [ort.OrtValue.ortvalue_from_numpy(self.arrays[n][start:stop]) for n in self.layout.past_names]
            for past, present, value in zip(self.layout.past_names, self.layout.present_names, values):
                binding.bind_ortvalue_input(past, value)
                binding.bind_ortvalue_output(present, value)
            self._views[key] = (binding, values)  # the OrtValues stay referenced as long as the binding
        return self._views[key][0]

    def _run(self, ids: np.ndarray, mask: np.ndarray, start: int, stop: int) -> np.ndarray:
        ids, mask = np.ascontiguousarray(ids), np.ascontiguousarray(mask)  # referenced until the run returns
        binding = self._binding(start, stop)
        binding.bind_cpu_input("input_ids", ids)
        binding.bind_cpu_input("attention_mask", mask)
        binding.bind_output("logits", "cpu")
        self.session.run_with_iobinding(binding)
        return binding.get_outputs()[0].numpy()

    def _copy_row(self, slot: Slot, row: int) -> None:
        if slot.row != row:
            for a in self.arrays.values():
                a[row, :, :slot.length] = a[slot.row, :, :slot.length]
            slot.row = row

    def _swap_rows(self, a: Slot, b: Slot) -> None:
        n = max(a.length, b.length)
        for arr in self.arrays.values():
            arr[[a.row, b.row], :, :n] = arr[[b.row, a.row], :, :n]
        a.row, b.row = b.row, a.row
