"""What a task needs to answer and to be served, apart from how its graph runs.

A task module declares ``head`` (how one input is tokenized into the rows the graph sees, and how
those rows' outputs become its answer: ``xformopt.load(ARTIFACT).predict`` and ``xformopt serve``) and
``serving`` (its HTTP route, request body and load-test payload). ``runtime/``, ``serve/`` and
``loadtest/`` ask these and never test a task's name, so adding a task is one module here plus its tests.
The heads see the predictor only through the attributes they read (``tokenizer``, ``max_length``,
``labels``, ``multi_label``, ``pooling``).
"""

from __future__ import annotations

import copy
import importlib
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from xformopt.errors import InputError

FEATURES = ("input_ids", "attention_mask", "token_type_ids")


@dataclass
class Row:
    """One sequence the graph sees: its unpadded token features (1-D id lists)."""

    features: dict[str, list[int]]

    @property
    def length(self) -> int:
        return len(self.features["input_ids"])


@dataclass
class Prepared:
    """One input, tokenized: its rows and what ``finish`` needs besides their outputs."""

    rows: list[Row]
    context: Any = None


class Head:
    """A task's predictor head. ``embeds``: answers are vectors (``embed()``, pooled per the model's
    modules); ``pairs``: an input may be a (text, text_pair) tuple."""

    embeds = False
    pairs = False

    @staticmethod
    def prepare(predictor, inputs: list, truncate: bool) -> list[Prepared]:
        raise NotImplementedError

    @staticmethod
    def finish(predictor, prepared: Prepared, outputs: list[np.ndarray], **options) -> Any:
        raise NotImplementedError


@dataclass(frozen=True)
class Serving:
    """How `xformopt serve` exposes a task and `xformopt loadtest` drives it.

    ``routes``: the HTTP routes; the first is the one load tests post to, with the inputs under ``field``;
    ``main``: the one TEI also serves at ``POST /`` and ``/invocations`` (the first, unless named).
    ``body``: the request model's name in :mod:`xformopt.tasks.bodies` (pydantic, loaded only by the
    server); ``options``: the body fields passed on to ``predict``; ``two_texts_are_a_pair``: TEI's
    ``[a, b]`` is one pair; ``structured``: inputs are objects (dumped to dicts), and a load test needs
    rows of them; ``warmup``: one input built from a warm-up text."""

    routes: tuple[str, ...]
    main: str | None = None  # TEI's main route, also at POST / and /invocations [default: the first route]
    kind: str = "predict"  # which route set serve builds: "embed", "predict" (the body below), "rerank"
    field: str = "inputs"
    body: str | None = None
    options: tuple[str, ...] = ("truncate",)
    two_texts_are_a_pair: bool = False
    structured: str | None = None  # what a structured input holds, for messages ("question and context")
    warmup: Callable[[str], Any] = lambda text: text  # noqa: E731 (the default: the text itself)

    @property
    def main_route(self) -> str:
        return self.main or self.routes[0]

    def request_model(self):
        return getattr(importlib.import_module("xformopt.tasks.bodies"), self.body) if self.body else None


def check_texts(texts: list) -> None:
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise InputError(f"input {i} is a {type(text).__name__}, not a string; pass texts")


def is_pair(value) -> bool:
    """A (text, text_pair) tuple. Lists are batches, never pairs: ``["a", "b"]`` is two texts (the HTTP
    route turns TEI's ``[a, b]`` into a tuple before it gets here)."""
    return isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, str) for v in value)


def tokenizer_for(predictor, truncate: bool | str):
    """The predictor's tokenizer, or for ``truncate="left"`` (TEI's ``truncation_direction``) a copy of it that
    cuts from the start: a tokenizer's truncation side is its state, not a call argument, and the shared one
    must not change under a batch being tokenized."""
    if truncate != "left":
        return predictor.tokenizer
    left = getattr(predictor, "_left_tokenizer", None)
    if left is None:
        left = copy.deepcopy(predictor.tokenizer)
        left.truncation_side = "left"
        predictor._left_tokenizer = left
    return left


def tokenize(predictor, texts: list[str], pairs: list[str] | None, truncate: bool | str, **extra):
    """One fast-tokenizer call; ``truncate``: True (or "right") cuts the end, "left" the start; with
    ``truncate=False`` an over-long input is an InputError naming it."""
    limit = predictor.max_length
    encoded = tokenizer_for(predictor, truncate)(texts, pairs, truncation=bool(truncate),
                                                 max_length=limit if truncate else None, **extra)
    if not truncate:
        for i, ids in enumerate(encoded["input_ids"]):
            if len(ids) > limit:
                raise InputError(f"input {i} has {len(ids)} tokens, more than the model's {limit}; shorten it or "
                                 "allow truncation (truncate: true)")
    return encoded


def row_of(encoded, i: int) -> Row:
    return Row({k: list(encoded[k][i]) for k in FEATURES if k in encoded})


def is_token_ids(value) -> bool:
    """A list of token ids (TEI and OpenAI take them in place of a text)."""
    return isinstance(value, list) and bool(value) and all(type(v) is int for v in value)


def id_row(predictor, ids: list[int], truncate: bool, index: int) -> Row:
    """One input given as token ids, fed as given (no special tokens added, as TEI and OpenAI do); cut at
    the model's limit, or an InputError naming it with ``truncate=False``."""
    vocab = len(predictor.tokenizer)
    if any(not 0 <= i < vocab for i in ids):
        raise InputError(f"input {index} has a token id outside the model's vocabulary of {vocab}")
    if len(ids) > predictor.max_length:
        if not truncate:
            raise InputError(f"input {index} has {len(ids)} tokens, more than the model's {predictor.max_length}; "
                             "shorten it or allow truncation (truncate: true)")
        ids = ids[-predictor.max_length:] if truncate == "left" else ids[:predictor.max_length]
    features = {"input_ids": list(ids), "attention_mask": [1] * len(ids)}
    if "token_type_ids" in predictor.tokenizer.model_input_names:
        features["token_type_ids"] = [0] * len(ids)
    return Row(features)


def single_rows(predictor, texts: list, truncate: bool, **extra) -> tuple[Any, list[Prepared]]:
    """Texts checked and tokenized in one call, one row each: (the encoding, the prepared inputs)."""
    check_texts(texts)
    encoded = tokenize(predictor, texts, None, truncate, **extra)
    return encoded, [Prepared([row_of(encoded, i)]) for i in range(len(texts))]


def l2_normalize(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.clip(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12, None)
