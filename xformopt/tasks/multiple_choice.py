"""multiple-choice: a multiple-choice head (SWAG, HellaSwag, ARC-style rows); per row one logit per
choice; metrics accuracy where the rows are labelled, arg-max agreement with the PyTorch fp32
baseline always.

Data (JSONL, JSON, CSV, TSV or a datasets directory): a context column (``context``, ``sent1``,
``question``, ``ctx``, ``startphrase``, ``goal``, ``premise`` or ``--text-column``), the choices as
one list column (``endings``, ``choices``, ``options``; in CSV a JSON list) or as ``ending0``,
``ending1``, ... columns, an optional label (the index of the right choice). SWAG's ``sent2`` (or
``--text-pair-column``), the start of every ending, is written before each ending, as SWAG's own
preprocessing does. Every row must have the same number of choices: the graph takes
``[batch, choices, tokens]`` and the outputs are ``[rows, choices]``.

Latency is timed on whole requests, one row's context with all its choices (``[1, choices, T]``),
which is what a served request carries; ``timing_inputs`` joins the choices with CHOICE_SEP and
``encode`` splits them again.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np

from xformopt.data import TextDataset, _guess_column, _named_column, _text_values
from xformopt.data_files import _read_table
from xformopt.errors import InputError
from xformopt.scoring.metrics import accuracy, proportion
from xformopt.tasks.base import AGREEMENT, Metric, Task, argmax_budget_points

CONTEXT_COLUMNS = ("context", "sent1", "question", "ctx", "startphrase", "goal", "premise", "text")
LIST_COLUMNS = ("endings", "choices", "options")
PREFIX_COLUMNS = ("sent2",)
LABEL_COLUMNS = ("label", "labels", "answer")
CHOICE_SEP = "\x1f"  # ASCII unit separator: between the choices of one timing request
HIDDEN_LABEL = -1  # SWAG's and HellaSwag's test splits hide the gold label as -1


def _choices(value, table, i, column) -> list:
    """A list column's value: a list, a JSON list (CSV), or {"text": [...]} (CommonsenseQA)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            pass
    if isinstance(value, dict) and isinstance(value.get("text"), list):
        value = value["text"]
    if not isinstance(value, list):
        raise InputError(f"{table.name} {table.where(i)}: column {column!r} holds a {type(value).__name__}, "
                         'not a list of choices; write e.g. "endings": ["...", "..."]')
    return value


def _label(value, table, i, column, n_choices) -> int | None:
    if value is None or (isinstance(value, float) and np.isnan(value)) or (isinstance(value, str) and not value.strip()):
        return None
    try:
        if isinstance(value, bool) or float(value) != int(float(value)):
            raise ValueError
        label = int(float(value))
    except (TypeError, ValueError, OverflowError):
        raise InputError(f"{table.name} {table.where(i)}: label {value!r} in column {column!r} is not a choice "
                         f"index; write the index (0-{n_choices - 1}) of the right choice") from None
    if label != HIDDEN_LABEL and not 0 <= label < n_choices:
        raise InputError(f"{table.name} {table.where(i)}: label {label} in column {column!r} is not one of the "
                         f"{n_choices} choices; write an index 0-{n_choices - 1}")
    return label


class MultipleChoice(Task):
    name = "multiple-choice"
    summary = "one of several endings per context (SWAG, HellaSwag, ARC-style)"
    auto_model = "AutoModelForMultipleChoice"
    export_outputs = ("logits",)
    input_axes = ("batch_size", "num_choices", "sequence_length")
    architectures = ("ForMultipleChoice",)
    headline = "accuracy"
    metrics = {"accuracy": Metric("Accuracy", percent=True), "agreement_with_baseline": AGREEMENT}
    passes = ("export", "fuse", "quantize")  # prune and distill optimise classifier or embedding objectives

    # ------------------------------------------------------------------ data

    def default_data(self, split):
        raise InputError("multiple-choice has no vendored data: pass --data FILE (SWAG-like rows: a context, the "
                         "choices as `endings` or ending0..N, a label)")

    def load(self, path, *, label2id, limit, seed, columns=None, require_labels=None):
        columns = columns or {}
        table = _read_table(path)
        if table.n_rows == 0:
            raise InputError(f"{table.name} has no rows; give a file with a header and at least one example")
        listing = ", ".join(table.columns)
        if columns.get("text"):
            context_col = _named_column(table, columns["text"], "--text-column")
        else:
            context_col = _guess_column(table.columns, CONTEXT_COLUMNS)
            if context_col is None:
                raise InputError(f"no context column in {table.name} (columns: {listing}); pass --text-column NAME")
        contexts = _text_values(table, context_col)

        list_col = _guess_column(table.columns, LIST_COLUMNS, taken={context_col})
        numbered = []
        while (found := _guess_column(table.columns, (f"ending{len(numbered)}",))) is not None:
            numbered.append(found)
        if list_col:
            endings = [_choices(v, table, i, list_col) for i, v in enumerate(table.fetch(list_col))]
            where = f"column {list_col!r}"
        elif len(numbered) >= 2:
            endings = [list(row) for row in zip(*(table.fetch(c) for c in numbered))]
            where = f"columns {numbered[0]!r}..{numbered[-1]!r}"
        else:
            raise InputError(f"no choices in {table.name} (columns: {listing}); give an 'endings' list column "
                             "or ending0, ending1, ... columns")
        n_choices = len(endings[0])
        for i, row in enumerate(endings):
            if len(row) != n_choices or len(row) < 2:
                raise InputError(f"{table.name} {table.where(i)}: {len(row)} choices in {where}, but "
                                 + (f"the first row has {n_choices}; every row needs the same number of choices"
                                    if len(row) != n_choices else "a question needs at least 2"))
            for choice in row:
                if not isinstance(choice, str) or not choice.strip():
                    raise InputError(f"{table.name} {table.where(i)}: an empty or non-text choice in {where}; "
                                     "fill it in or remove the row")

        pair = columns.get("text_pair")
        prefix_col = (None if pair == "" else _named_column(table, pair, "--text-pair-column") if pair
                      else _guess_column(table.columns, PREFIX_COLUMNS, taken={context_col}))
        if prefix_col:  # SWAG: sent2 starts every ending
            prefixes = [v.strip() if isinstance(v, str) else "" for v in table.fetch(prefix_col)]
            endings = [[f"{p} {e}".strip() for e in row] for p, row in zip(prefixes, endings)]

        name = columns.get("label")
        label_col = (None if name == "" else _named_column(table, name, "--label-column") if name
                     else _guess_column(table.columns, LABEL_COLUMNS, taken={context_col, list_col, prefix_col}))
        labels = None
        if label_col:
            parsed = [_label(v, table, i, label_col, n_choices) for i, v in enumerate(table.fetch(label_col))]
            present = [p for p in parsed if p is not None and p != HIDDEN_LABEL]
            if present:
                missing = next((i for i, p in enumerate(parsed) if p is None or p == HIDDEN_LABEL), None)
                if missing is not None:
                    raise InputError(f"{table.name} {table.where(missing)}: no label in column {label_col!r}; fill "
                                     "it in, or pass --label-column '' to load without labels")
                labels = parsed
        if require_labels and labels is None:
            raise InputError(f"{table.name}: no labels (columns: {listing}); add a 'label' column with the index "
                             "of the right choice, or pass --label-column NAME")

        n = table.n_rows
        source = (f"{table.name} (context={context_col!r}, choices={where} x{n_choices}, prefix={prefix_col!r}, "
                  f"label={label_col if labels else None!r})")
        data = TextDataset(texts=contexts, text_pairs=None, labels=labels,
                           label_names={i: f"choice {i}" for i in range(n_choices)} if labels else None,
                           source=source, row_ids=list(range(n)), path=str(path), extra={"endings": endings})
        if limit is None or limit >= n:
            return replace(data, source=f"{source}; all {n} rows")
        keep = sorted(np.random.default_rng(seed).permutation(n)[:limit].tolist())  # as load_text_dataset samples
        return data.subset(keep)

    # ------------------------------------------------------------------ running a stage

    def encode(self, tokenizer, texts, pairs=None, max_length: int = 512) -> dict[str, np.ndarray]:
        """``[batch, choices, tokens]`` inputs: every (context, choice) pair, padded to the batch's longest.
        ``pairs``: each row's choices joined by CHOICE_SEP; a plain text (no pairs) is a one-choice
        question, so export parity and the INT8 checks can feed plain texts. The hook Predictor.tokenize
        should call (see /work/notes/wt-fmmc.md)."""
        texts = list(texts)
        choices = [p.split(CHOICE_SEP) for p in pairs] if pairs is not None else None
        width = len(choices[0]) if choices else 1
        if choices and any(len(c) != width for c in choices):
            raise ValueError("every row of a multiple-choice batch needs the same number of choices")
        first = [t for t in texts for _ in range(width)]
        second = [c for row in choices for c in row] if choices else None
        flat = tokenizer(first, second, padding=True, truncation=True, max_length=max_length, return_tensors="np")
        return {k: v.reshape(len(texts), width, -1) for k, v in flat.items()}

    def predict(self, predictor, data, batch_size=32, progress=None):
        endings = data.extra["endings"]
        # Rows ordered by length (context plus its longest choice), so each batch pads little.
        order = sorted(range(len(data)), key=lambda i: len(data.texts[i]) + max(map(len, endings[i])))
        out: np.ndarray | None = None
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            encoded = self.encode(predictor.tokenizer, [data.texts[i] for i in idx],
                                  [CHOICE_SEP.join(endings[i]) for i in idx], predictor.max_length)
            got = predictor.run_encoded(encoded)
            if out is None:
                out = np.empty((len(data), *got.shape[1:]), dtype=np.float32)
            out[idx] = got
            if progress is not None:
                progress(start + len(idx), len(order))
        return out

    def timing_inputs(self, data):
        endings = data.extra.get("endings")
        if endings is None:  # plain texts (a verification sample read as texts): one-choice questions
            return list(data.texts), None
        return list(data.texts), [CHOICE_SEP.join(row) for row in endings]

    # ------------------------------------------------------------------ scoring

    def score(self, outputs, baseline, data, seed=0):
        pred = np.asarray(outputs).argmax(-1)
        metrics = {} if baseline is None else {"agreement_with_baseline": proportion(pred == np.asarray(baseline).argmax(-1))}
        if data.labels is not None:
            metrics = {"accuracy": accuracy(pred, np.asarray(data.labels)), **metrics}
        return metrics

    def budget_points(self, outputs, reference, data):
        return argmax_budget_points(outputs, reference, data.labels)


TASK = MultipleChoice()
