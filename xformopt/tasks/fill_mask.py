"""fill-mask: a masked-language-model head; per row the top-5 tokens (ids and probabilities) at the
first mask; metrics top-1/top-5 accuracy where the rows name the expected word, agreement with the
PyTorch fp32 baseline's top-1 and top-5 overlap always.

Data: one text per row with ``[MASK]`` or ``<mask>`` where the word to predict goes (either literal
is mapped to the model's own mask token), and an optional target column holding the expected word.
Without data of the user's own (the vendored movie-review texts), one content word per text is
masked deterministically (seeded per row) and becomes that row's target.

Outputs are ``[rows, 2, 5]`` float32: ``[:, 0]`` the token ids, ``[:, 1]`` their probabilities,
best first. Every metric needs only the top 5, and the file saved beside the artifact stays 40
bytes a row whatever the vocabulary (full logits at the mask would be 120 KB a row for BERT's 30k
tokens, 1 MB for XLM-R's 250k). Ids are exact in float32 up to 2**24, far above any vocabulary.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace
from pathlib import Path

import numpy as np

from xformopt.data import (
    TextDataset,
    _guess_column,
    _named_column,
    _resolve_text_column,
    _text_values,
    load_text_dataset,
)
from xformopt.data_files import _read_table
from xformopt.errors import InputError
from xformopt.resources import vader_split_path
from xformopt.scoring.metrics import proportion
from xformopt.tasks.base import AGREEMENT, Metric, Task

MASK_LITERALS = ("[MASK]", "<mask>")
TARGET_COLUMNS = ("target", "answer", "word", "label")
TOP_K = 5
MASK_POSITION = "mask_position"  # key an encoded batch carries beside the graph inputs
NO_TARGET, MULTI_TOKEN = -1, -2  # target ids that are not token ids

# A hand-kept stop list (no library dependency for ~70 words): masking "the" or "and" tests grammar,
# not the model's knowledge, and almost every model gets it right.
STOPWORDS = frozenset("""
a about after all also an and any are as at be because been but by can could did do does for from
had has have he her him his how if in into is it its just more most my no not now of on one only or
other our out she so some than that the their them then there these they this those to too up very
was we were what when which who will with would you your
""".split())
_WORD = re.compile(r"[A-Za-z]+(?:'[a-z]+)?")
_LITERAL = re.compile("|".join(re.escape(m) for m in MASK_LITERALS))


def with_model_mask(text: str, mask_token: str) -> str:
    """``text`` with each ``[MASK]``/``<mask>`` literal written as the model's own mask token."""
    return _LITERAL.sub(lambda _: mask_token, text)


def mask_positions(input_ids: np.ndarray, mask_id: int) -> np.ndarray:
    """Per row the first position holding ``mask_id``, -1 where none (e.g. truncated away)."""
    hit = np.asarray(input_ids) == mask_id
    return np.where(hit.any(1), hit.argmax(1), -1)


def top_k(logits: np.ndarray, k: int = TOP_K) -> np.ndarray:
    """``[rows, vocab]`` logits -> ``[rows, 2, k]``: token ids and softmax probabilities, best first."""
    logits = np.asarray(logits, dtype=np.float64)
    k = min(k, logits.shape[-1])
    ids = np.argsort(-logits, axis=-1, kind="stable")[:, :k]  # stable: ties keep the lower id, as torch.topk
    shifted = logits - logits.max(-1, keepdims=True)
    probs = np.exp(shifted) / np.exp(shifted).sum(-1, keepdims=True)
    return np.stack([ids.astype(np.float64), np.take_along_axis(probs, ids, -1)], axis=1).astype(np.float32)


def top5_overlap(outputs: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Per row the share of the reference's top-5 ids that are among the outputs' top-5."""
    a, b = np.asarray(outputs)[:, 0, :].astype(np.int64), np.asarray(reference)[:, 0, :].astype(np.int64)
    return (b[:, :, None] == a[:, None, :]).any(-1).mean(-1)


def mean_with_ci(values: np.ndarray) -> dict:
    """Mean of per-row values in [0, 1], with the normal 95% interval of the mean (clipped to [0, 1])."""
    values = np.asarray(values, dtype=np.float64)
    n = int(values.size)
    mean = float(values.mean()) if n else float("nan")
    stderr = float(values.std(ddof=1) / math.sqrt(n)) if n > 1 else 0.0
    return {"value": mean, "n": n, "stderr": stderr,
            "ci95": [max(0.0, mean - 1.96 * stderr), min(1.0, mean + 1.96 * stderr)]}


def target_ids(tokenizer, texts: list[str], targets: list[str | None], max_length: int) -> np.ndarray:
    """The model's token id for each row's target word at its first mask: the one token where the text
    with the target written in differs from the masked text. Taken from the tokenization in context,
    so WordPiece casing, BPE's leading-space tokens and SentencePiece all come out as the model sees
    them. NO_TARGET for rows without one, MULTI_TOKEN where the word is not one token of the vocabulary."""
    mask = tokenizer.mask_token
    out = np.full(len(texts), NO_TARGET, dtype=np.int64)
    for i, (text, target) in enumerate(zip(texts, targets)):
        if not target:
            continue
        masked = tokenizer(text, truncation=True, max_length=max_length)["input_ids"]
        filled = tokenizer(text.replace(mask, target, 1), truncation=True, max_length=max_length)["input_ids"]
        if tokenizer.mask_token_id not in masked:
            continue  # truncated away: predict refuses the row
        at = masked.index(tokenizer.mask_token_id)
        same_around = len(filled) == len(masked) and filled[:at] == masked[:at] and filled[at + 1:] == masked[at + 1:]
        out[i] = filled[at] if same_around else MULTI_TOKEN
    return out


def _is_vendored(path: str | Path) -> bool:
    root = vader_split_path("test").parent.parent
    try:
        return Path(str(path).split("::")[0]).resolve().is_relative_to(root)
    except OSError:
        return False


def mask_one_word(text: str, rng: np.random.Generator) -> tuple[str, str] | None:
    """(text with one content word replaced by [MASK], that word), or None when it has no word."""
    words = list(_WORD.finditer(text))
    content = [m for m in words if len(m.group()) >= 3 and m.group().lower() not in STOPWORDS] or words
    if not content:
        return None
    pick = content[int(rng.integers(len(content)))]
    return text[:pick.start()] + "[MASK]" + text[pick.end():], pick.group()


class FillMask(Task):
    name = "fill-mask"
    summary = "masked-language-model heads: the word at [MASK] (BERT, RoBERTa, ...)"
    auto_model = "AutoModelForMaskedLM"
    head_may_be_fresh = False
    export_outputs = ("logits",)
    architectures = ("ForMaskedLM",)
    # Agreement, not accuracy: targets are optional (the headline must exist in every report), and
    # what an optimisation can lose is the fp32 model's own answer; top-1 accuracy is reported beside
    # it whenever the rows name their words.
    headline = "agreement_with_baseline"
    metrics = {"agreement_with_baseline": AGREEMENT, "top5_overlap": Metric("Top-5 overlap", relative=True),
               "top1_accuracy": Metric("Top-1 acc.", percent=True), "top5_accuracy": Metric("Top-5 acc.", percent=True)}
    agreement_measure = "top-5 overlap"
    passes = ("export", "fuse", "quantize")  # prune and distill optimise classifier or embedding objectives

    # ------------------------------------------------------------------ data

    def load(self, path, *, label2id, limit, seed, columns=None, require_labels=None):
        columns = columns or {}
        if _is_vendored(path):  # no data of the user's own: mask the vendored texts
            data = load_text_dataset(path, text_column=columns.get("text"), text_pair_column="", label_column="",
                                     limit=limit, seed=seed)
            masked = [mask_one_word(t, np.random.default_rng([seed, r])) for t, r in zip(data.texts, data.row_ids)]
            keep = [i for i, m in enumerate(masked) if m is not None]
            data = data.subset(keep) if len(keep) < len(data) else data
            masked = [masked[i] for i in keep]
            return replace(data, texts=[m[0] for m in masked], extra={"target": [m[1] for m in masked]},
                           source=f"{data.source}; one content word per text masked (seed {seed})")

        table = _read_table(path)
        if table.n_rows == 0:
            raise InputError(f"{table.name} has no rows; give a file with a header and at least one example")
        text_col = _resolve_text_column(table, columns.get("text"))
        texts = _text_values(table, text_col)
        for i, text in enumerate(texts):
            if not _LITERAL.search(text):
                raise InputError(f"{table.name} {table.where(i)}: no mask in column {text_col!r}; write [MASK] "
                                 "(or <mask>) where the word to predict goes")
        name = columns.get("label")
        target_col = (None if name == "" else _named_column(table, name, "--label-column") if name
                      else _guess_column(table.columns, TARGET_COLUMNS, taken={text_col}))
        targets: list[str | None] = [None] * table.n_rows
        if target_col:
            for i, value in enumerate(table.fetch(target_col)):
                if isinstance(value, bool) or not isinstance(value, (str, int, type(None))):
                    raise InputError(f"{table.name} {table.where(i)}: target in column {target_col!r} is a "
                                     f"{type(value).__name__}; write the expected word as text")
                targets[i] = (str(value).strip() or None) if value is not None else None
        if require_labels and not any(targets):
            raise InputError(f"{table.name}: no target words (columns: {', '.join(table.columns)}); add a "
                             "'target' column with the expected word, or pass --label-column NAME")
        n = table.n_rows
        data = TextDataset(texts=texts, text_pairs=None, labels=None, label_names=None, row_ids=list(range(n)),
                           source=f"{table.name} (text={text_col!r}, target={target_col!r})", path=str(path),
                           extra={"target": targets})
        if limit is None or limit >= n:
            return replace(data, source=f"{data.source}; all {n} rows")
        keep = sorted(np.random.default_rng(seed).permutation(n)[:limit].tolist())  # as load_text_dataset samples
        return data.subset(keep)

    # ------------------------------------------------------------------ running a stage

    def encode(self, tokenizer, texts, pairs=None, max_length: int = 512) -> dict[str, np.ndarray]:
        """A batch as the graph takes it, with the model's mask token for the literals and each row's
        first mask position beside the inputs (ort_feed and TorchPredictor feed only graph inputs).
        The hook Predictor.tokenize should call (see /work/notes/wt-fmmc.md)."""
        texts = [with_model_mask(t, tokenizer.mask_token) for t in texts]
        encoded = dict(tokenizer(texts, list(pairs) if pairs is not None else None, padding=True, truncation=True,
                                 max_length=max_length, return_tensors="np"))
        encoded[MASK_POSITION] = mask_positions(encoded["input_ids"], tokenizer.mask_token_id)
        return encoded

    def finish(self, raw, encoded):
        positions = encoded.get(MASK_POSITION)
        if positions is None:  # a plain-text request (export parity, timing): no mask; the first text token
            positions = np.full(len(raw), 1)
        positions = np.where(positions < 0, 1, positions).clip(0, raw.shape[1] - 1)
        return top_k(raw[np.arange(len(raw)), positions])

    def predict(self, predictor, data, batch_size=32, progress=None):
        tokenizer = predictor.tokenizer
        if tokenizer.mask_token is None:
            raise InputError(f"the tokenizer of {predictor.spec.source} has no mask token; fill-mask needs a "
                             "masked-language model's tokenizer")
        # score() gets no tokenizer: the targets' token ids are resolved here, once, beside the rows.
        if "target" in data.extra and "target_id" not in data.extra:
            texts = [with_model_mask(t, tokenizer.mask_token) for t in data.texts]
            data.extra["target_id"] = target_ids(tokenizer, texts, data.extra["target"], predictor.max_length).tolist()
        order = sorted(range(len(data)), key=lambda i: len(data.texts[i]))  # little padding per batch
        out = np.empty((len(data), 2, TOP_K), dtype=np.float32)
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            encoded = self.encode(tokenizer, [data.texts[i] for i in idx], max_length=predictor.max_length)
            lost = np.flatnonzero(encoded[MASK_POSITION] < 0)
            if lost.size:
                row = data.row_ids[idx[lost[0]]]
                raise InputError(f"{data.path or data.source} row {row}: the mask is past the model's "
                                 f"{predictor.max_length} tokens and was truncated away; shorten that text")
            got = predictor.run_encoded(encoded)
            out[idx, :, :got.shape[-1]] = got
            if progress is not None:
                progress(start + len(idx), len(order))
        return out

    # ------------------------------------------------------------------ scoring

    def score(self, outputs, baseline, data, seed=0):
        ids = np.asarray(outputs)[:, 0, :].astype(np.int64)
        metrics = {}
        targets = np.asarray(data.extra.get("target_id", []), dtype=np.int64)
        usable = targets >= 0
        if usable.any():
            skipped = {"skipped_multi_token": int((targets == MULTI_TOKEN).sum())}
            metrics["top1_accuracy"] = {**proportion(ids[usable, 0] == targets[usable]), **skipped}
            metrics["top5_accuracy"] = {**proportion((ids[usable] == targets[usable, None]).any(1)), **skipped}
        if baseline is None:  # a bench run without the fp32 reference: the target metrics alone
            return metrics
        base = np.asarray(baseline)[:, 0, 0].astype(np.int64)
        metrics["agreement_with_baseline"] = proportion(ids[:, 0] == base)
        metrics["top5_overlap"] = mean_with_ci(top5_overlap(outputs, baseline))
        return metrics

    def agreement(self, outputs, reference):
        return top5_overlap(outputs, reference)

    def budget_points(self, outputs, reference, data):
        targets = np.asarray(data.extra.get("target_id", []), dtype=np.int64)
        if (targets >= 0).any():
            usable = targets >= 0
            return "top1_accuracy", 100.0 * float((np.asarray(outputs)[usable, 0, 0] == targets[usable]).mean())
        if reference is None:
            return "agreement_with_float", 100.0
        return "agreement_with_float", 100.0 * float((outputs[:, 0, 0] == reference[:, 0, 0]).mean())

    def timing_inputs(self, data):
        # The literals, not the model's mask token (no tokenizer here): "[MASK]" and "<mask>" are one
        # special token for BERT- and RoBERTa-style tokenizers, so the timed lengths are the served ones.
        return list(data.texts), None

    def skipped_without_baseline(self):
        return "agreement_with_baseline and top5_overlap"


TASK = FillMask()
