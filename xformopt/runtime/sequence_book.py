"""The sequences a decoding engine holds, and the checks every engine makes on them before it runs the
graph: :class:`~xformopt.runtime.batch_decoder.BatchDecoder` (one shared buffer) and
:class:`~xformopt.runtime.serial_decoder.SerialDecoder` (a cache per sequence) differ in where a cache lives,
not in how the serve scheduler opens, fills, decodes and closes sequences."""

from __future__ import annotations

from xformopt.errors import InputError


class SequenceBook:
    """``decoding`` rows (prompt read) and ``prefilling`` ones, the call counters, the engine's bounds;
    an engine supplies ``fits``."""

    def start_book(self, max_kv_tokens: int, max_rows: int) -> None:
        if max_kv_tokens < 1 or max_rows < 1:
            raise InputError(f"max_kv_tokens ({max_kv_tokens}) and max_rows ({max_rows}) must be at least 1")
        self.max_kv_tokens, self.max_rows = int(max_kv_tokens), int(max_rows)
        self.decoding: list = []
        self.prefilling: list = []
        self.calls = {"prefill": 0, "decode": 0}

    @property
    def slots(self) -> list:
        return self.decoding + self.prefilling

    @property
    def cached_positions(self) -> int:
        return sum(s.length for s in self.slots)

    def fits(self, reserved: int) -> bool:
        raise NotImplementedError

    def check_open(self, reserved: int) -> None:
        if not self.fits(reserved):
            raise InputError(f"a sequence of {reserved} positions does not fit beside the {len(self.slots)} open "
                             f"(at most {self.max_kv_tokens} cached positions, {self.max_rows} rows)")

    def check_prefill(self, slot, new: int) -> None:
        if slot.decoding or slot not in self.prefilling:
            raise ValueError("prefill takes a sequence opened and not yet decoding")
        if slot.length + new > slot.reserved:
            raise ValueError(f"{slot.length + new} positions exceed the {slot.reserved} reserved")

    def check_start(self, slot) -> None:
        if slot.length == 0 or slot not in self.prefilling:
            raise ValueError("start_decoding takes a sequence whose prompt was read")

    def check_decode(self, tokens) -> None:
        """One token per decoding row, and no row past its reservation."""
        if len(tokens) != len(self.decoding) or not self.decoding:
            raise ValueError(f"decode takes one token per decoding row ({len(self.decoding)}), got {len(tokens)}")
        if any(s.length + 1 > s.reserved for s in self.decoding):
            raise ValueError("a row would grow past its reservation")
