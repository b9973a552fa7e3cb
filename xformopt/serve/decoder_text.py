"""A stream's text as its tokens arrive: what may be sent now, and whether a stop string ended it.

OpenAI's ``stop``: the answer ends *before* the first stop string and does not contain it. So while
streaming, text that could be the start of a stop string is held back until the next tokens show it
is not, and text that ends in an incomplete UTF-8 character (a byte-level token that splits one) is
held back until the character is whole; nothing sent is ever taken back.
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"  # what the tokenizer decodes an incomplete byte sequence to


class IncrementalText:
    def __init__(self, tokenizer, stop: list[str] | None = None):
        self.tokenizer = tokenizer
        self.stop = [s for s in (stop or []) if s]
        self.sent = ""  # text already handed out
        self.text = ""  # the whole decoded continuation so far
        self.stop_hit: str | None = None

    def add(self, new_ids: list[int]) -> str:
        """The text to send after the continuation grew to ``new_ids`` ("" when nothing is safe yet);
        ``stop_hit`` is set once a stop string appeared (then the answer is final)."""
        self.text = self.tokenizer.decode(new_ids, skip_special_tokens=True)
        visible = self.text
        if self.stop:
            found = [(visible.find(s), s) for s in self.stop if s in visible]
            if found:
                cut, self.stop_hit = min(found)
                return self._send(visible[:cut])
            visible = visible[: len(visible) - self._stop_prefix(visible)]
        if visible.endswith(REPLACEMENT):
            visible = visible.rstrip(REPLACEMENT)
        return self._send(visible)

    def flush(self) -> str:
        """At the end (no stop string hit): whatever was held back."""
        return "" if self.stop_hit is not None else self._send(self.text)

    def _stop_prefix(self, text: str) -> int:
        """Length of the longest end of ``text`` that a stop string starts with."""
        longest = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(text)), longest, -1):
                if text.endswith(s[:k]):
                    longest = k
                    break
        return longest

    def _send(self, visible: str) -> str:
        # Decoding a longer sequence can, rarely, change earlier characters (tokenizer clean-up);
        # what was sent stays sent, and only text past it goes out.
        if not visible.startswith(self.sent) or len(visible) <= len(self.sent):
            return ""
        delta = visible[len(self.sent):]
        self.sent = visible
        return delta
