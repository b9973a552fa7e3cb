"""Sources as the encoder graph takes them (ids and mask, padded to the longest, cut at the model's positions),
straight from a fast tokenizer's Rust backend.

transformers' ``tokenizer(texts, padding=True, truncation=True, max_length=N, return_tensors="np")`` sets the
backend's padding and truncation again on every call and converts its encodings through several Python layers:
about 30 us for one short source, where the backend's own ``encode_batch`` takes about 6 us (the tiny T5's
tokenizer; docs/seq2seq.md). On a small model's ~0.5 ms sentence that is a few percent of every request. A copy of
the backend is configured once, the way transformers configures it for that call (longest-first truncation
without stride on the tokenizer's truncation side, padding to the longest on its padding side), so the shared
tokenizer's state is never changed; tested to give transformers' ids and masks. A tokenizer without a Rust
backend (a slow one), or without a pad token, goes through transformers' call.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class SourceEncoder:
    def __init__(self, tokenizer, max_length: int):
        self.tokenizer, self.max_length = tokenizer, max_length
        self.backend = _configured_backend(tokenizer, max_length)

    def __call__(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(input_ids, attention_mask), int64, ``[len(texts), longest]``."""
        if self.backend is None:
            enc = self.tokenizer(list(texts), padding=True, truncation=True, max_length=self.max_length,
                                 return_tensors="np")
            return enc["input_ids"].astype(np.int64), enc["attention_mask"].astype(np.int64)
        encodings = self.backend.encode_batch(list(texts))
        return (np.array([e.ids for e in encodings], dtype=np.int64),
                np.array([e.attention_mask for e in encodings], dtype=np.int64))


def _configured_backend(tokenizer, max_length: int):
    backend = getattr(tokenizer, "backend_tokenizer", None) if getattr(tokenizer, "is_fast", False) else None
    if backend is None or tokenizer.pad_token_id is None:
        return None
    from tokenizers import Tokenizer

    own = Tokenizer.from_str(backend.to_str())
    own.enable_truncation(max_length, stride=0, strategy="longest_first", direction=tokenizer.truncation_side)
    own.enable_padding(direction=tokenizer.padding_side, pad_id=tokenizer.pad_token_id,
                       pad_type_id=tokenizer.pad_token_type_id, pad_token=tokenizer.pad_token)
    return own
