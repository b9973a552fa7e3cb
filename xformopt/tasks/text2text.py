"""What translation and summarization share: encoder-decoder models (``*ForConditionalGeneration``)
whose stages generate text from a source, scored against reference targets.

Held-out rows have a source column and, to be scored, a target column (JSONL, CSV/TSV or a datasets
folder): ``--text-column`` names the source (default: source, src, text, document, article, input),
``--label-column`` the reference (default: target, tgt, reference, summary, highlights, output).
Outputs of a stage are generated token ids (one row per source, padded with -1); the evaluation
(xformopt/evaluate/seq2seq.py) decodes them and calls :meth:`Text2Text.score_texts`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from xformopt.data import TextDataset, _guess_column, _named_column, _text_values
from xformopt.data_files import _listing, _read_table
from xformopt.errors import InputError
from xformopt.resources import word_seq2seq_path
from xformopt.scoring.metrics import proportion
from xformopt.scoring.text_generation import require, same_text
from xformopt.tasks.base import Metric, Task

SOURCE_COLUMNS = ("source", "src", "text", "document", "article", "input", "sentence")
TARGET_COLUMNS = ("target", "tgt", "reference", "references", "summary", "highlights", "output", "translation")
TARGETS = "targets"  # TextDataset.extra key of the reference texts


class Text2Text(Task):
    auto_model = "AutoModelForSeq2SeqLM"
    ort_model = "ORTModelForSeq2SeqLM"
    export_task = "text2text-generation-with-past"
    architectures = ("ForConditionalGeneration", "MTModel")  # MarianMTModel
    graph = "seq2seq"
    head_may_be_fresh = False  # the LM head comes with the checkpoint
    passes = ("export", "fuse", "quantize")
    agreement_floor = 0.9
    agreement_measure = "next-token agreement with the float graph (teacher-forced on its greedy output)"
    default_set = "reverse"  # the vendored synthetic set (xformopt/resources/word_seq2seq)
    refuses = {
        "profile": "`xformopt profile` profiles encoder graphs only; the report times encoder-decoder stages per "
                   "generated sentence",
        "search": "xformopt search covers encoders (text-classification, feature-extraction)",
    }

    def load(self, path, *, label2id, limit, seed, columns=None, require_labels=None) -> TextDataset:
        columns = columns or {}
        require()  # the metric packages, before any pass runs
        table = _read_table(path)
        if table.n_rows == 0:
            raise InputError(f"{table.name} has no rows; give a file with source and target columns")
        if columns.get("text"):
            source = _named_column(table, columns["text"], "--text-column")
        else:
            source = _guess_column(table.columns, SOURCE_COLUMNS)
        if source is None:
            raise InputError(f"no source column in {table.name} (columns: {_listing(table.columns)}); "
                             "pass --text-column NAME")
        wanted = columns.get("label")
        if wanted:
            target = _named_column(table, wanted, "--label-column")
        else:
            target = None if wanted == "" else _guess_column(table.columns, TARGET_COLUMNS, taken={source})
        if target is None and require_labels:
            raise InputError(f"no target column in {table.name} (columns: {_listing(table.columns)}); "
                             "pass --label-column NAME (the reference translations or summaries)")
        texts = _text_values(table, source)
        extra = {TARGETS: _text_values(table, target)} if target else {}
        data = TextDataset(texts=texts, text_pairs=None, labels=None, label_names=None,
                           source=f"{table.name} (source={source!r}, target={target!r})",
                           row_ids=list(range(table.n_rows)), path=str(path), extra=extra)
        if limit is None or limit >= len(data):
            return data
        keep = sorted(np.random.default_rng(seed).permutation(len(data))[:limit].tolist())
        return data._take(keep, f"{limit} of {len(data)} rows (limit {limit}, seed {seed})")

    def default_data(self, split: str) -> Path:
        return word_seq2seq_path(self.default_set, split)

    def score(self, outputs, baseline, data, seed=0):
        raise NotImplementedError("text-to-text stages are scored on decoded text: Text2Text.score_texts")

    def reference_metrics(self, hypotheses: list[str], references: list[str], seed: int) -> dict:
        """The task's own metrics against the references (BLEU/chrF, ROUGE)."""
        raise NotImplementedError

    def score_texts(self, hypotheses: list[str], baseline: list[str] | None, data: TextDataset, seed: int = 0,
                    next_token_agreement: np.ndarray | None = None) -> dict:
        """Metrics of one stage's decoded outputs: the task's against the references where the rows have
        them, the share of rows whose output equals the fp32 baseline's, and next-token agreement."""
        metrics = {}
        references = data.extra.get(TARGETS)
        if references is not None:
            metrics.update(self.reference_metrics(hypotheses, list(references), seed))
        if baseline is not None:
            metrics["same_output_as_baseline"] = proportion(same_text(hypotheses, baseline) > 0)
        if next_token_agreement is not None:
            metrics["next_token_agreement"] = proportion(next_token_agreement > 0)
        return metrics

    def budget_value(self, metrics: dict) -> float:
        """The headline in points (0-100) that quantize's accuracy budget holds."""
        value = metrics[self.headline]["value"]
        return float(value) * (100.0 if self.metrics[self.headline].percent else 1.0)

    def agreement(self, outputs, reference):
        return (np.asarray(outputs) == np.asarray(reference)).astype(np.float64)


SHARED_METRICS = {
    "same_output_as_baseline": Metric("Same output", percent=True, relative=True),
    "next_token_agreement": Metric("Next-token agr.", percent=True, relative=True),
}
