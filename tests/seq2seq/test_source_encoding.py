"""The sources' ids and masks straight from the tokenizer's Rust backend equal transformers' call with padding and
truncation (xformopt/seq2seq/source_encoding.py), and the shared tokenizer is left as it was."""

from __future__ import annotations

import numpy as np
import pytest
from tiny_seq2seq import build_tokenizer

from xformopt.seq2seq.source_encoding import SourceEncoder

SOURCES = ["w1 w2 w3", "w4", "w5 w6 w7 w8 w9 w10 w11 w12 w13 w14 w15 w16", "w2 w2 w3 w3 w9"]


def transformers_call(tokenizer, texts, max_length):
    enc = tokenizer(list(texts), padding=True, truncation=True, max_length=max_length, return_tensors="np")
    return enc["input_ids"].astype(np.int64), enc["attention_mask"].astype(np.int64)


@pytest.mark.parametrize("bos", [False, True], ids=["t5-scheme", "bart-scheme"])
@pytest.mark.parametrize("sides", [("right", "right"), ("left", "left")], ids=["right", "left"])
@pytest.mark.parametrize("max_length", [64, 6])
def test_the_backend_gives_transformers_ids_and_masks(tmp_path, bos, sides, max_length):
    tokenizer = build_tokenizer(tmp_path, bos=bos)
    tokenizer.truncation_side, tokenizer.padding_side = sides
    encode = SourceEncoder(tokenizer, max_length)
    assert encode.backend is not None
    cases = ([SOURCES[0]], [SOURCES[2]], SOURCES)  # one source, one over max_length 6, a padded batch
    got = [encode(texts) for texts in cases]
    # the shared tokenizer's own backend is not configured by the encoder (transformers' call below does that)
    assert tokenizer.backend_tokenizer.truncation is None and tokenizer.backend_tokenizer.padding is None
    for texts, (ids, mask) in zip(cases, got):
        want_ids, want_mask = transformers_call(tokenizer, texts, max_length)
        np.testing.assert_array_equal(ids, want_ids)
        np.testing.assert_array_equal(mask, want_mask)
        assert ids.dtype == mask.dtype == np.int64
    if max_length == 6:
        assert got[1][0].shape == (1, 6)  # cut, on the tokenizer's side


def test_a_bert_tokenizer_too(tmp_path, tokenizer_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    encode = SourceEncoder(tokenizer, 8)
    texts = ["a movie", "the best film of the year, and the longest one too", "bad"]
    for got, want in zip(encode(texts), transformers_call(tokenizer, texts, 8)):
        np.testing.assert_array_equal(got, want)


def test_a_tokenizer_without_a_rust_backend_goes_through_transformers(tmp_path):
    tokenizer = build_tokenizer(tmp_path, bos=False)

    class Slow:  # what a slow tokenizer offers: the call, no backend
        is_fast = False
        pad_token_id = tokenizer.pad_token_id

        def __call__(self, *args, **kwargs):
            return tokenizer(*args, **kwargs)

    encode = SourceEncoder(Slow(), 64)
    assert encode.backend is None
    for got, want in zip(encode(SOURCES), transformers_call(tokenizer, SOURCES, 64)):
        np.testing.assert_array_equal(got, want)
