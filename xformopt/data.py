"""The one loader for held-out, calibration and training text sets.

Every command that reads examples goes through ``load_text_dataset`` so that file
formats, column guessing, label mapping and sub-sampling behave the same everywhere.

Inputs:

- ``.csv`` (comma separated, standard quoting) and ``.tsv`` (tab separated, no quoting:
  the GLUE convention, so a stray ``"`` inside a sentence stays text), both with a header row;
- ``.jsonl`` / ``.json``: one JSON object per line (a ``.json`` holding a single top-level
  array of objects is accepted too);
- a Hugging Face ``datasets`` directory written by ``save_to_disk``. For a DatasetDict pick
  the split with ``PATH::SPLIT``; otherwise the first of test, validation, train is used.
  ``datasets`` is imported only there (``xformopt.data_files``, the readers), so it stays optional.

Every problem is an ``InputError`` (exit 2) whose one-line message names the problem
and the fix. The whole file is validated even when ``limit`` keeps only some rows, so
that changing ``limit``/``seed`` never turns a working command into a failing one and
label ids assigned from names do not depend on the sample.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from xformopt.data_files import _Table, _cap, _listing, _read_table
from xformopt.errors import InputError

TEXT_COLUMNS = ("text", "sentence", "sentence1", "content", "review", "document", "question",
                "question1", "premise")
PAIR_COLUMNS = ("text_pair", "sentence2", "question2", "hypothesis")
LABEL_COLUMNS = ("label", "labels", "target", "class", "y")
# GLUE and many HF test splits store -1 where the gold label is hidden.
HIDDEN_LABEL = -1

_INT_LIKE = re.compile(r"^[+-]?\d+(\.0*)?$")  # "1", "-1", and "1.0" as pandas writes ints next to NaNs


@dataclass(frozen=True)
class TextDataset:
    """Loaded examples; ``row_ids`` are indices into the original file for disjointness checks."""

    texts: list[str]
    text_pairs: list[str] | None
    labels: list[int] | None
    label_names: dict[int, str] | None
    source: str  # a description: file, columns, sample
    row_ids: list[int]
    path: str = ""  # the file (or datasets folder, with ::split) the rows came from
    # Per-row payloads a task keeps beside the texts (e.g. words and tag ids, answer spans), by name.
    extra: dict[str, list] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.texts)
        named = [(name, getattr(self, name)) for name in ("text_pairs", "labels", "row_ids")]
        for name, values in named + [(f"extra[{k!r}]", v) for k, v in self.extra.items()]:
            if values is not None and len(values) != n:
                raise ValueError(f"TextDataset.{name} has {len(values)} entries, texts has {n}")

    def __len__(self) -> int:
        return len(self.texts)

    def subset(self, indices: Sequence[int]) -> TextDataset:
        """The rows at ``indices`` (positions in this dataset), in the order given."""
        return self._take([int(i) for i in indices], f"subset of {len(indices)} rows")

    def split(self, fraction: float, seed: int) -> tuple[TextDataset, TextDataset]:
        """Two disjoint parts: ``fraction`` of the rows (rounded, at least one) and the rest.

        Stratified by label when the rows have labels and every class can be in both parts (each
        part then keeps the label mix); otherwise a plain random split. Deterministic for a given
        ``seed``; each part keeps the original row order.
        """
        from sklearn.model_selection import train_test_split

        if not 0 < fraction < 1:
            raise InputError(f"split fraction must be strictly between 0 and 1, got {fraction}; pass e.g. 0.8")
        n = len(self)
        if n < 2:
            raise InputError(f"cannot split {self.source}: it has {n} row(s) and a split needs at least 2; "
                             "use a larger data file")
        k = min(max(round(n * fraction), 1), n - 1)  # both parts non-empty
        strata = self._strata(k)
        first, second = train_test_split(np.arange(n), train_size=k, test_size=n - k, random_state=seed,
                                         stratify=strata)
        first, second = sorted(first.tolist()), sorted(second.tolist())
        note = f"split {fraction:g} seed {seed}{', stratified by label' if strata is not None else ''}"
        return (self._take(first, f"{note}, part 1 ({k} rows)"),
                self._take(second, f"{note}, part 2 ({n - k} rows)"))

    def _strata(self, k: int) -> list[int] | None:
        """The labels to stratify a ``k`` / ``n - k`` split by, or None where stratifying cannot work
        (no labels, one class, a class of one row, or a part smaller than the number of classes)."""
        if not self.labels:
            return None
        counts = np.unique(self.labels, return_counts=True)[1]
        if len(counts) < 2 or counts.min() < 2 or min(k, len(self) - k) < len(counts):
            return None
        return self.labels

    def _take(self, indices: list[int], note: str) -> TextDataset:
        bad = [i for i in indices if not 0 <= i < len(self)]
        if bad:  # negative indices would silently wrap around
            raise IndexError(f"row index {bad[0]} out of range for a dataset of {len(self)} rows")

        def pick(values: list | None) -> list | None:
            return None if values is None else [values[i] for i in indices]

        return replace(self, texts=pick(self.texts), text_pairs=pick(self.text_pairs),
                       labels=pick(self.labels), row_ids=pick(self.row_ids),
                       extra={k: pick(v) for k, v in self.extra.items()}, source=f"{self.source}; {note}")


def load_text_dataset(
    path: str | Path,
    *,
    text_column: str | None = None,
    text_pair_column: str | None = None,
    label_column: str | None = None,
    label2id: dict[str, int] | None = None,
    require_labels: bool = False,
    limit: int | None = None,
    seed: int = 0,
) -> TextDataset:
    """Load a text (or text-pair) dataset with optional labels.

    Column arguments: ``None`` guesses from common names; ``""`` (pair/label only) means
    "none", e.g. ``label_column=""`` loads without labels even if a label column exists.
    Labels that are ints (or strings of ints) are ids; other labels are names mapped
    through ``label2id`` (case-insensitively when unambiguous). Without ``label2id`` names
    get ids in sorted order. ``limit`` keeps a ``seed``-determined sample of rows in file order.
    """
    if limit is not None and limit < 1:
        raise InputError(f"limit must be at least 1 row, got {limit}; pass --limit N with N >= 1")
    table = _read_table(path)
    if table.n_rows == 0:
        raise InputError(f"{table.name} has no rows; give a file with a header and at least one example")

    text_col = _resolve_text_column(table, text_column)
    pair_col = _resolve_pair_column(table, text_pair_column, text_col)
    label_col = _resolve_label_column(table, label_column, require_labels, taken={text_col, pair_col})

    texts = _text_values(table, text_col)
    pairs = _text_values(table, pair_col) if pair_col else None
    labels, label_names, label_note = None, None, ""
    if label_col:
        labels, label_names, label_note = _label_values(
            table, label_col, label2id, must_exist=require_labels or label_column is not None)

    n = table.n_rows
    columns = f"text={text_col!r}, pair={pair_col!r}, label={label_col if labels else None!r}"
    notes = ", ".join(x for x in (table.note, label_note) if x)
    source = f"{table.name} ({columns}{'; ' + notes if notes else ''})"
    dataset = TextDataset(texts=texts, text_pairs=pairs, labels=labels, label_names=label_names,
                          source=source, row_ids=list(range(n)), path=str(path))
    if limit is None or limit >= n:
        return replace(dataset, source=f"{source}; all {n} rows")
    keep = sorted(np.random.default_rng(seed).permutation(n)[:limit].tolist())
    return dataset._take(keep, f"{limit} of {n} rows (limit {limit}, seed {seed})")


# --------------------------------------------------------------------------- reading


# --------------------------------------------------------------------------- columns


def _find_column(columns: list[str], name: str) -> str | None:
    """Exact name, else the single column that matches ignoring case."""
    if name in columns:
        return name
    folded = [c for c in columns if c.casefold() == name.casefold()]
    return folded[0] if len(folded) == 1 else None


def _guess_column(columns: list[str], candidates: Sequence[str], taken: set[str | None] = frozenset()) -> str | None:
    for candidate in candidates:
        found = _find_column(columns, candidate)
        if found is not None and found not in taken:
            return found
    return None


def _named_column(table: _Table, name: str, flag: str) -> str:
    if name in table.columns:
        return name
    near = _find_column(table.columns, name)
    hint = f"did you mean {near!r}? " if near else ""
    raise InputError(f"column {name!r} not found in {table.name} (columns: {_listing(table.columns)}); "
                     f"{hint}pass {flag} NAME with one of these")


def _resolve_text_column(table: _Table, name: str | None) -> str:
    if name:
        return _named_column(table, name, "--text-column")
    guessed = _guess_column(table.columns, TEXT_COLUMNS)
    if guessed is None:
        raise InputError(f"no text column in {table.name} (columns: {_listing(table.columns)}); "
                         "pass --text-column NAME")
    return guessed


def _resolve_pair_column(table: _Table, name: str | None, text_col: str) -> str | None:
    if name == "":
        return None
    if name is not None:
        return _named_column(table, name, "--text-pair-column")
    # only a column that is clearly the second sentence; a single-text task has none of these
    return _guess_column(table.columns, PAIR_COLUMNS, taken={text_col})


def _resolve_label_column(table: _Table, name: str | None, required: bool, taken: set[str | None]) -> str | None:
    if name == "":
        if required:
            raise InputError("labels are required here but --label-column '' disables them; "
                             "pass --label-column NAME")
        return None
    if name is not None:
        return _named_column(table, name, "--label-column")
    guessed = _guess_column(table.columns, LABEL_COLUMNS, taken=taken)
    if guessed is None and required:
        raise InputError(f"no label column in {table.name} (columns: {_listing(table.columns)}); "
                         "pass --label-column NAME")
    return guessed


def _text_values(table: _Table, column: str) -> list[str]:
    values = table.fetch(column)
    for i, value in enumerate(values):
        if value is None or (isinstance(value, str) and not value.strip()):
            raise InputError(f"{table.name} {table.where(i)}: empty or missing text in column {column!r}; "
                             "fill it in or remove the row")
        if not isinstance(value, str):
            raise InputError(f"{table.name} {table.where(i)}: column {column!r} holds a "
                             f"{type(value).__name__}, not text; pass the column with the sentences")
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:  # JSON "\ud800": no UTF-8 form, so the tokenizer and every report would fail
                raise InputError(f"{table.name} {table.where(i)}: the text in column {column!r} holds a lone "
                                 "surrogate escape (\\ud800-\\udfff), not a character; fix that text") from None
    return values


# --------------------------------------------------------------------------- labels


def _label_values(table: _Table, column: str, label2id: dict[str, int] | None,
                  must_exist: bool) -> tuple[list[int] | None, dict[int, str] | None, str]:
    """Label ids, the id -> name table, and a note for the source when the column was ignored."""
    parsed = [_parse_label(table, column, i, v) for i, v in enumerate(table.fetch(column))]
    present = [p for p in parsed if p is not None]
    if not present or all(p == HIDDEN_LABEL for p in present):
        # e.g. a GLUE test split: a label column that carries no gold labels
        if must_exist:
            raise InputError(f"{table.name}: column {column!r} has no labels (all empty or {HIDDEN_LABEL}, "
                             "as in hidden-label test splits); use a labelled file or split (PATH::validation)")
        return None, None, f"label column {column!r} is empty, loaded without labels"
    missing = next((i for i, p in enumerate(parsed) if p is None), None)
    if missing is not None:
        raise InputError(f"{table.name} {table.where(missing)}: no label in column {column!r}; fill it in, "
                         "or pass --label-column '' to load without labels")
    if label2id:  # an empty mapping says nothing; treat it like none
        ids, names = _map_through_model(table, parsed, label2id)
    else:
        ids, names = _assign_ids(table, column, parsed)
    return ids, names, ""


MAX_LABEL_ID = 2**31 - 1  # class ids index an int32/int64 logits row; anything larger is not an id


def _parse_label(table: _Table, column: str, row: int, value: Any) -> int | str | None:
    """An id (int), a name (str) or None for a missing label."""
    label = _parse_label_value(table, column, row, value)
    if isinstance(label, int) and abs(label) > MAX_LABEL_ID:
        shown = str(label)
        shown = shown if len(shown) <= 24 else f"{shown[:12]}...({len(shown)} digits)"
        raise InputError(f"{table.name} {table.where(row)}: label id {shown} in column {column!r} is too large to "
                         f"be a class id (at most {MAX_LABEL_ID}); use the model's ids or label names")
    return label


def _parse_label_value(table: _Table, column: str, row: int, value: Any) -> int | str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if math.isnan(value):  # pandas writes missing values as NaN
            return None
        if math.isinf(value):
            return MAX_LABEL_ID + 1  # refused above as too large
        if value.is_integer():
            return int(value)
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return None
        if not _INT_LIKE.match(text):
            return text
        try:
            number = float(text)
        except OverflowError:  # pragma: no cover - float() returns inf instead
            number = math.inf
        return MAX_LABEL_ID + 1 if math.isinf(number) else (int(text) if text.lstrip("+-").isdigit() and len(text) < 4000
                                                           else int(number))
    raise InputError(f"{table.name} {table.where(row)}: label {value!r} in column {column!r} is not a class id "
                     "or name (regression and multi-label targets are not supported); pass a classification "
                     "label column")


def _map_through_model(table: _Table, parsed: list[int | str],
                       label2id: dict[str, int]) -> tuple[list[int], dict[int, str]]:
    id2name: dict[int, str] = {}
    for name, i in label2id.items():
        id2name.setdefault(int(i), name)
    id2name = dict(sorted(id2name.items()))
    known = ", ".join(f"{i}={name}" for i, name in id2name.items())
    exact = {name: int(i) for name, i in label2id.items()}
    folded: dict[str, set[int]] = {}
    for name, i in label2id.items():
        folded.setdefault(name.casefold(), set()).add(int(i))

    ids: list[int] = []
    unknown: dict[str, int] = {}  # name -> first row, so the message lists each name once
    for row, value in enumerate(parsed):
        if isinstance(value, int):
            if value not in id2name:
                raise InputError(f"{table.name} {table.where(row)}: label id {value} is not a class of the "
                                 f"model (known: {_cap(known)}); use the model's ids or label names")
            ids.append(value)
            continue
        if value in exact:
            ids.append(exact[value])
            continue
        matches = folded.get(value.casefold(), set())
        if len(matches) > 1:
            raise InputError(f"{table.name} {table.where(row)}: label {value!r} matches several model labels "
                             f"when case is ignored (known: {_cap(known)}); spell it exactly")
        if matches:
            ids.append(next(iter(matches)))
        else:
            unknown.setdefault(value, row)
            ids.append(-1)
    if unknown:
        shown = _listing([f"{name!r} ({table.where(row)})" for name, row in unknown.items()], limit=5)
        raise InputError(f"{table.name}: labels not known to the model: {shown}; known labels: {_cap(known)}; "
                         "fix the data or use a model trained with these labels")
    return ids, id2name


def _assign_ids(table: _Table, column: str, parsed: list[int | str]) -> tuple[list[int], dict[int, str]]:
    """Without the model's mapping: ids stay ids, names get ids in sorted order."""
    first_id = next((i for i, p in enumerate(parsed) if isinstance(p, int)), None)
    first_name = next((i for i, p in enumerate(parsed) if isinstance(p, str)), None)
    if first_id is not None and first_name is not None:
        raise InputError(f"{table.name}: column {column!r} mixes ids ({parsed[first_id]} at "
                         f"{table.where(first_id)}) and names ({parsed[first_name]!r} at "
                         f"{table.where(first_name)}); use one or the other")
    if first_name is not None:
        names = sorted(set(parsed))
        index = {name: i for i, name in enumerate(names)}
        return [index[p] for p in parsed], dict(enumerate(names))
    negative = next((i for i, p in enumerate(parsed) if p < 0), None)
    if negative is not None:
        raise InputError(f"{table.name} {table.where(negative)}: label id {parsed[negative]} is negative; "
                         "label ids start at 0 (fill in the label or drop the row)")
    classes = table.class_names.get(column, [])
    ids = sorted(set(parsed))
    names = {i: classes[i] if i < len(classes) else str(i) for i in ids}
    return list(parsed), names


