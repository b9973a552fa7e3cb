"""Word-level tagged sentences (NER, POS) for the token-classification task.

Inputs:

- CoNLL files (``.conll``, ``.iob``, ``.txt``): one token per line, the tag in the last
  whitespace-separated column (the CoNLL-2003 layout ``EU NNP B-NP B-ORG``), a blank line between
  sentences, ``-DOCSTART-`` lines skipped. A file whose lines all hold a single column is unlabelled.
- the tables ``xformopt.data`` reads (``.jsonl``/``.json``, ``.csv``/``.tsv`` with JSON lists in the
  cells, a ``datasets`` save_to_disk directory) with a tokens column (``tokens``, ``words``) and an
  optional tags column (``ner_tags``, ``pos_tags``, ``tags``, ``labels``). A table with only a text
  column (e.g. the vendored sentiment split) is read as whitespace-split words, unlabelled.

Tags are names (mapped through the model's label2id; a ``datasets`` ClassLabel sequence is mapped by
its names, since a dataset's ids need not be the model's) or the model's ids. Rows become a
TextDataset with ``texts`` = the words joined by spaces (timing, verification) and
``extra = {"words": [[...]], "tags": [[ids]]}`` (no "tags" when unlabelled).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from xformopt import data as tables, data_files
from xformopt.errors import InputError

CONLL_SUFFIXES = (".conll", ".iob", ".txt")
TOKEN_COLUMNS = ("tokens", "words", "token", "word")
TAG_COLUMNS = ("ner_tags", "pos_tags", "tags", "labels", "ner", "pos", "tag")
DOCSTART = "-DOCSTART-"
FORMATS = f"CoNLL ({', '.join(CONLL_SUFFIXES)}: token first, tag last, blank line between sentences) or {data_files.SUPPORTED_FORMATS}"


def load_tagged(path: str | Path, *, label2id: dict[str, int] | None, limit: int | None = None, seed: int = 0,
                columns: dict[str, str | None] | None = None, require_labels: bool = False) -> tables.TextDataset:
    """Tagged (or untagged) sentences from ``path``; ``columns``: text = the tokens column, label = the
    tags column ("" = load without tags). Validates the whole file before ``limit`` samples it."""
    columns = columns or {}
    if limit is not None and limit < 1:
        raise InputError(f"limit must be at least 1 row, got {limit}; pass --limit N with N >= 1")
    if columns.get("text_pair"):
        raise InputError("token-classification reads one sentence per row; drop --text-pair-column")
    file, _ = data_files._parse_path(path)
    if file.is_file() and file.suffix.lower() in CONLL_SUFFIXES:
        name, words, tags, where, note = _read_conll(file, want_tags=columns.get("label") != "")
        class_names = None
    else:
        name, words, tags, where, note, class_names = _read_tokens_table(path, columns)
    if not words:
        raise InputError(f"{name} has no sentences; give a file with at least one tagged sentence ({FORMATS})")
    if tags is None and require_labels:
        raise InputError(f"{name} has no tags; this needs tagged sentences (a tags column, or a tag in the last "
                         "CoNLL column)")
    id2label = _id2label(label2id)
    ids = _tag_ids(name, words, tags, where, label2id, id2label, class_names) if tags is not None else None
    if ids is not None and id2label is None:  # no model mapping: names got sorted ids in _tag_ids
        id2label = ids[1]
    n = len(words)
    extra = {"words": words, **({"tags": ids[0]} if ids is not None else {})}
    source = f"{name} ({note}{'' if ids is not None else '; no tags'})"
    dataset = tables.TextDataset(texts=[" ".join(w) for w in words], text_pairs=None, labels=None,
                                 label_names=id2label, source=source, row_ids=list(range(n)), path=str(path),
                                 extra=extra)
    if limit is None or limit >= n:
        return replace(dataset, source=f"{source}; all {n} sentences")
    keep = sorted(np.random.default_rng(seed).permutation(n)[:limit].tolist())
    return dataset._take(keep, f"{limit} of {n} sentences (limit {limit}, seed {seed})")


# --------------------------------------------------------------------------- CoNLL


def _read_conll(file: Path, want_tags: bool):
    """Sentences of (token, tag) lines. Hand-written: the format is four lines of rules and the
    libraries that read it (datasets' conll2003 script, nltk) fix the column layout or need downloads."""
    words: list[list[str]] = []
    tags: list[list[str]] = []
    lines: list[int] = []  # the first line of each sentence, for messages
    current: list[list[str]] = []
    widths: set[int] = set()
    first_line = 0

    def close():
        if current:
            words.append([c[0] for c in current])
            tags.append([c[-1] for c in current])
            lines.append(first_line)
            current.clear()

    with data_files._open_text(file) as handle:
        for number, line in enumerate(handle, start=1):
            fields = line.split()
            if not fields:
                close()
                continue
            if fields[0] == DOCSTART:
                close()
                continue
            if not current:
                first_line = number
            widths.add(min(len(fields), 2))
            if len(widths) > 1:
                raise InputError(f"{file} line {number}: some lines have a tag column and others do not; give every "
                                 "token line a tag (last column) or none")
            current.append(fields)
    close()
    labelled = widths == {2} and want_tags
    note = "CoNLL: token first column, " + ("tag last column" if labelled else "no tag column")
    return str(file), words, (tags if labelled else None), (lambda i: f"sentence at line {lines[i]}"), note


# --------------------------------------------------------------------------- tables


def _read_tokens_table(path, columns):
    table = data_files._read_table(path)
    if table.n_rows == 0:
        raise InputError(f"{table.name} has no rows; give a file with at least one tagged sentence ({FORMATS})")
    token_col = (tables._named_column(table, columns["text"], "--text-column") if columns.get("text")
                 else tables._guess_column(table.columns, TOKEN_COLUMNS))
    tag_flag = columns.get("label")
    if token_col is None:
        text_col = tables._guess_column(table.columns, tables.TEXT_COLUMNS)
        if text_col is None:
            raise InputError(f"no tokens column in {table.name} (columns: {data_files._listing(table.columns)}); "
                             f"pass --text-column NAME (a list of words per row: {', '.join(TOKEN_COLUMNS)})")
        if tag_flag:
            raise InputError(f"--label-column {tag_flag!r} needs a tokens column (a list of words per row) in "
                             f"{table.name}; pass --text-column NAME")
        texts = tables._text_values(table, text_col)
        note = f"no tokens column: the words of text column {text_col!r}, split on whitespace"
        return table.name, [t.split() for t in texts], None, table.where, note, None
    if tag_flag == "":
        tag_col = None
    elif tag_flag:
        tag_col = tables._named_column(table, tag_flag, "--label-column")
    else:
        tag_col = tables._guess_column(table.columns, TAG_COLUMNS, taken={token_col})
    words = [_words(table, token_col, i, v) for i, v in enumerate(table.fetch(token_col))]
    tags = None
    if tag_col is not None:
        tags = [_list_cell(table, tag_col, i, v, "tags") for i, v in enumerate(table.fetch(tag_col))]
        missing = [i for i, t in enumerate(tags) if t is None]
        if len(missing) == len(tags):
            tags = None
        elif missing:
            raise InputError(f"{table.name} {table.where(missing[0])}: no tags in column {tag_col!r}; tag every "
                             "sentence, or pass --label-column '' to load without tags")
    note = ", ".join(x for x in (f"tokens={token_col!r}, tags={tag_col if tags is not None else None!r}", table.note) if x)
    return table.name, words, tags, table.where, note, (table.class_names.get(tag_col) if tags is not None else None)


def _list_cell(table, column: str, row: int, value: Any, what: str) -> list | None:
    """A list cell; CSV/TSV cells hold it as a JSON list."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            value = None
        if not isinstance(value, list):
            raise InputError(f"{table.name} {table.where(row)}: column {column!r} holds text, not a list of {what}; "
                             f'write the {what} as a JSON list, e.g. ["EU", "rejects", "German"]')
    if not isinstance(value, (list, tuple)):
        raise InputError(f"{table.name} {table.where(row)}: column {column!r} holds a {type(value).__name__}, not a "
                         f"list of {what}; pass the column with one list of {what} per sentence")
    return list(value)


def _words(table, column: str, row: int, value: Any) -> list[str]:
    words = _list_cell(table, column, row, value, "tokens")
    if not words:
        raise InputError(f"{table.name} {table.where(row)}: no tokens in column {column!r}; fill it in or remove the row")
    for word in words:
        if not isinstance(word, str) or not word.strip():
            raise InputError(f"{table.name} {table.where(row)}: token {word!r} in column {column!r} is not a word "
                             "(empty or not text); every token must be a non-empty string")
        if not word.isascii():
            try:
                word.encode("utf-8")
            except UnicodeEncodeError:
                raise InputError(f"{table.name} {table.where(row)}: a token in column {column!r} holds a lone "
                                 "surrogate escape (\\ud800-\\udfff), not a character; fix that token") from None
    return words


# --------------------------------------------------------------------------- tags


def _id2label(label2id: dict[str, int] | None) -> dict[int, str] | None:
    if not label2id:
        return None
    id2label: dict[int, str] = {}
    for name, i in label2id.items():
        id2label.setdefault(int(i), name)
    return dict(sorted(id2label.items()))


def _tag_ids(name, words, tags, where, label2id, id2label, class_names):
    """Tag ids per sentence (names through the model's label2id; ids checked against its labels), and
    the id -> name table when the model gives none."""
    for i, (w, t) in enumerate(zip(words, tags)):
        if len(w) != len(t):
            raise InputError(f"{name} {where(i)}: {len(w)} tokens but {len(t)} tags; give one tag per token")
    known = ", ".join(f"{i}={n}" for i, n in (id2label or {}).items())
    if class_names is not None:  # a datasets ClassLabel sequence: its ids are the dataset's, not the model's
        tags = [[class_names[v] if isinstance(v, int) and 0 <= v < len(class_names) else v for v in t] for t in tags]
    if id2label is None:
        names = sorted({str(v) for t in tags for v in t})
        if all(_as_id(v) is not None for t in tags for v in t):
            ids = [[_as_id(v) for v in t] for t in tags]
            return ids, {i: str(i) for i in sorted({v for t in ids for v in t})}
        index = {n: i for i, n in enumerate(names)}
        return [[index[str(v)] for v in t] for t in tags], dict(enumerate(names))
    folded: dict[str, set[int]] = {}
    for label, i in label2id.items():
        folded.setdefault(label.casefold(), set()).add(int(i))
    ids: list[list[int]] = []
    for row, sentence in enumerate(tags):
        out = []
        for value in sentence:
            tag_id = _as_id(value)
            if tag_id is not None:
                if tag_id not in id2label:
                    raise InputError(f"{name} {where(row)}: tag id {tag_id} is not a label of the model (known: "
                                     f"{data_files._cap(known)}); use the model's tag ids or names")
            elif isinstance(value, str) and value in label2id:
                tag_id = int(label2id[value])
            elif isinstance(value, str) and len(folded.get(value.casefold(), ())) == 1:
                tag_id = next(iter(folded[value.casefold()]))
            else:
                raise InputError(f"{name} {where(row)}: tag {value!r} is not a label of the model (known: "
                                 f"{data_files._cap(known)}); fix the data or use a model trained with these tags")
            out.append(tag_id)
        ids.append(out)
    return ids, id2label


def _as_id(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("+-").isdigit() and len(value) < 20:
        return int(value)
    return None
