"""SQuAD-style rows for extractive question answering: question, context, gold answer spans.

Formats:

- the official nested SQuAD JSON (v1.1 and v2.0): ``{"data": [{"paragraphs": [{"context", "qas":
  [{"question", "id", "answers": [{"text", "answer_start"}], "is_impossible"?}]}]}]}``;
- flat rows in any format :func:`xformopt.data_files._read_table` reads (JSON lines, a JSON array, CSV/TSV,
  a datasets ``save_to_disk`` directory): ``question``, ``context``, optional ``id``, ``is_impossible``
  and ``answers`` as HF datasets stores SQuAD (``{"text": [...], "answer_start": [...]}``) or a list of
  ``{"text", "answer_start"}`` (a CSV cell may hold either as JSON text).

A row without answers (or ``is_impossible``: xformopt scores SQuAD v1.1-style and never predicts "no
answer") is unlabelled: it is predicted and compared with the baseline but not counted in EM/F1.
Every answer's ``answer_start`` must point at its text inside the context, so a shifted offset (a
re-encoded or stripped context) is refused rather than silently scored against the wrong span.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from xformopt.data import TextDataset, _find_column, _named_column, _text_values
from xformopt.data_files import _Table, _listing, _open_text, _parse_path, _read_table
from xformopt.errors import InputError

QUESTION, CONTEXT, ANSWERS = "question", "context", "answers"
FORMATS = ("the official SQuAD JSON (data -> paragraphs -> qas), or rows with question, context and answers "
           "(.jsonl/.json/.csv or a datasets directory)")


def load_squad(path: str | Path, *, limit: int | None = None, seed: int = 0,
               columns: dict[str, str | None] | None = None) -> TextDataset:
    """QA rows: ``texts`` = questions, ``text_pairs`` = contexts, ``extra`` = {"answers": per row a
    list of {"text", "answer_start"} (empty: unlabelled), "ids": per row its id}.
    ``columns``: text -> the question column, text_pair -> the context column, label -> answers."""
    if limit is not None and limit < 1:
        raise InputError(f"limit must be at least 1 row, got {limit}; pass --limit N with N >= 1")
    columns = columns or {}
    nested = _read_nested(path)
    if nested is not None:
        name, rows = nested
        note = "official SQuAD JSON"
    else:
        table = _read_table(path)
        name, rows, note = table.name, _flat_rows(table, columns), "rows"
    if not rows:
        raise InputError(f"{name} has no questions; give {FORMATS} with at least one question")
    questions = [r[0] for r in rows]
    contexts = [r[1] for r in rows]
    answers = [r[2] for r in rows]
    ids = [r[3] for r in rows]
    n = len(rows)
    labelled = sum(1 for a in answers if a)
    source = f"{name} ({note}; {labelled} of {n} questions answered)"
    data = TextDataset(texts=questions, text_pairs=contexts, labels=None, label_names=None, source=source,
                       row_ids=list(range(n)), path=str(path), extra={"answers": answers, "ids": ids})
    if limit is None or limit >= n:
        return replace(data, source=f"{source}; all {n} rows")
    keep = sorted(np.random.default_rng(seed).permutation(n)[:limit].tolist())
    return data._take(keep, f"{limit} of {n} rows (limit {limit}, seed {seed})")


# --------------------------------------------------------------------------- nested SQuAD JSON


def _read_nested(path: str | Path) -> tuple[str, list[tuple]] | None:
    """The rows of an official SQuAD JSON file, or None when ``path`` is something else."""
    file, split = _parse_path(path)
    if split is not None or file.suffix.lower() != ".json" or not file.is_file():
        return None
    with _open_text(file) as handle:
        content = handle.read()
    if not content.lstrip().startswith("{"):
        return None
    try:
        document = json.loads(content)
    except (json.JSONDecodeError, RecursionError, ValueError):
        return None  # JSON lines (several objects) or broken: the flat reader names the line
    if not isinstance(document, dict) or "data" not in document:
        return None
    name = str(file)
    articles = document["data"]
    if not isinstance(articles, list):
        raise InputError(f"{name}: 'data' is a {type(articles).__name__}, not a list of articles; "
                         "use the official SQuAD layout (data -> paragraphs -> qas)")
    rows: list[tuple] = []
    for a, article in enumerate(articles):
        paragraphs = article.get("paragraphs") if isinstance(article, dict) else None
        if not isinstance(paragraphs, list):
            raise InputError(f"{name} data[{a}]: no 'paragraphs' list; use the official SQuAD layout "
                             "(data -> paragraphs -> qas)")
        for p, paragraph in enumerate(paragraphs):
            at = f"data[{a}].paragraphs[{p}]"
            if not isinstance(paragraph, dict) or not isinstance(paragraph.get("qas"), list):
                raise InputError(f"{name} {at}: no 'qas' list; each paragraph needs a context and its qas")
            context = _text(name, at, "context", paragraph.get("context"))
            for q, qa in enumerate(paragraph["qas"]):
                where = f"{at}.qas[{q}]"
                if not isinstance(qa, dict):
                    raise InputError(f"{name} {where}: a {type(qa).__name__}, not an object; "
                                     'write each question as {"question", "id", "answers"}')
                question = _text(name, where, "question", qa.get("question"))
                qid = str(qa.get("id", len(rows)))
                answers = [] if qa.get("is_impossible") else _answers(name, f"{where} (id {qid!r})", qa.get("answers"), context)
                rows.append((question, context, answers, qid))
    return name, rows


def _text(name: str, where: str, field: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{name} {where}: empty or missing {field!r}; fill it in or remove the question")
    return value


# --------------------------------------------------------------------------- flat rows


def _column(table: _Table, given: str | None, default: str, flag: str, required: bool) -> str | None:
    if given == "" and not required:
        return None
    if given:
        return _named_column(table, given, flag)
    found = _find_column(table.columns, default)
    if found is None and required:
        raise InputError(f"no {default!r} column in {table.name} (columns: {_listing(table.columns)}); "
                         f"question answering reads {QUESTION!r} and {CONTEXT!r} columns (SQuAD layout); "
                         f"pass {flag} NAME")
    return found


def _flat_rows(table: _Table, columns: dict[str, str | None]) -> list[tuple]:
    if table.n_rows == 0:
        return []
    q_col = _column(table, columns.get("text"), QUESTION, "--text-column", True)
    c_col = _column(table, columns.get("text_pair"), CONTEXT, "--text-pair-column", True)
    a_col = _column(table, columns.get("label"), ANSWERS, "--label-column", False)
    questions = _text_values(table, q_col)
    contexts = _text_values(table, c_col)
    raw_answers = table.fetch(a_col) if a_col else [None] * table.n_rows
    impossible = table.fetch("is_impossible") if "is_impossible" in table.columns else [None] * table.n_rows
    ids = table.fetch("id") if "id" in table.columns else [None] * table.n_rows
    rows = []
    for i in range(table.n_rows):
        qid = str(i) if ids[i] is None else str(ids[i])
        where = f"{table.where(i)} (id {qid!r})"
        answers = [] if _true(impossible[i]) else _answers(table.name, where, raw_answers[i], contexts[i])
        rows.append((questions[i], contexts[i], answers, qid))
    return rows


def _true(value: Any) -> bool:
    return value is True or (isinstance(value, (int, float)) and value == 1) or (
        isinstance(value, str) and value.strip().lower() in ("1", "true", "yes"))


# --------------------------------------------------------------------------- answers


def _answers(name: str, where: str, value: Any, context: str) -> list[dict]:
    """Gold answers as [{"text", "answer_start"}], each checked against the context."""
    hint = ('write answers as {"text": [...], "answer_start": [...]} or a list of '
            '{"text": ..., "answer_start": ...}')
    if isinstance(value, str):  # a CSV cell, or a JSON-encoded column
        if not value.strip():
            return []
        try:
            value = json.loads(value)
        except (json.JSONDecodeError, RecursionError, ValueError):
            raise InputError(f"{name} {where}: answers {value[:60]!r} is not JSON; {hint}") from None
    if value is None:
        return []
    if isinstance(value, dict):
        texts, starts = value.get("text"), value.get("answer_start")
        if isinstance(texts, str) or not isinstance(texts, list) or not isinstance(starts, list) or len(texts) != len(starts):
            raise InputError(f"{name} {where}: answers needs equally long 'text' and 'answer_start' lists; {hint}")
        pairs = list(zip(texts, starts))
    elif isinstance(value, list):
        if not all(isinstance(a, dict) for a in value):
            raise InputError(f"{name} {where}: answers holds a non-object; {hint}")
        pairs = [(a.get("text"), a.get("answer_start")) for a in value]
    else:
        raise InputError(f"{name} {where}: answers is a {type(value).__name__}; {hint}")
    out = []
    for k, (text, start) in enumerate(pairs):
        if not isinstance(text, str) or not text.strip():
            raise InputError(f"{name} {where}: answer {k} has no text; {hint}")
        if isinstance(start, float) and start.is_integer():
            start = int(start)
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise InputError(f"{name} {where}: answer {k} answer_start {start!r} is not a character offset (an int >= 0); {hint}")
        if context[start:start + len(text)] != text:
            found = context.find(text)
            near = f"the text is at {found}" if found >= 0 else "the text is not in the context"
            raise InputError(f"{name} {where}: answer {k} {_short(text)} is not at answer_start {start} of the context "
                             f"({near}); fix answer_start (a character offset into the context)")
        out.append({"text": text, "answer_start": start})
    return out


def _short(text: str, limit: int = 40) -> str:
    return repr(text if len(text) <= limit else text[:limit - 3] + "...")
