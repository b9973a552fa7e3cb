"""Perplexity on held-out text, for the PyTorch baseline and any ONNX stage alike.

Each text is scored in one forward pass (teacher forcing: the logits at position t predict token
t+1), truncated to the context window. Perplexity = exp(total NLL / predicted tokens), pooled over
texts; the 95% interval is a seeded bootstrap over texts. A plain ``.txt`` file is read as one
stream and cut into windows of ``window`` tokens; other formats (CSV, TSV, JSONL, a datasets
directory) are read as rows through :func:`xformopt.data.load_text_dataset`.

Quality numbers mean something only for a trained checkpoint: a model with random weights has a
perplexity near its vocabulary size whatever the runtime does, so on such a model only the
*difference* between stages (baseline vs ONNX vs INT8) is informative.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from xformopt.data import load_text_dataset
from xformopt.errors import InputError
from xformopt.resources import vader_split_path

BOOTSTRAP = 200


def log_softmax(logits: np.ndarray) -> np.ndarray:
    logits = logits.astype(np.float64)
    top = logits.max(axis=-1, keepdims=True)
    return logits - top - np.log(np.exp(logits - top).sum(axis=-1, keepdims=True))


def token_lists(texts, tokenizer, context: int | None, window: int | None = None) -> list[list[int]]:
    """Token ids per text (at least 2 tokens, at most the context window)."""
    limit = min(x for x in (context, window) if x) if (context or window) else None
    out = []
    for text in texts:
        ids = list(tokenizer(text)["input_ids"])[:limit]
        if len(ids) >= 2:
            out.append(ids)
    return out


def stream_windows(text: str, tokenizer, window: int) -> list[list[int]]:
    ids = list(tokenizer(text)["input_ids"])
    return [ids[i : i + window] for i in range(0, len(ids), window) if len(ids[i : i + window]) >= 2]


def load_token_lists(path: Path | None, tokenizer, context: int | None, *, limit: int | None = None,
                     window: int = 128, seed: int = 0, texts=None) -> tuple[list[list[int]], str]:
    """Token lists from ``texts`` (already loaded rows), a ``.txt`` file, or a dataset file; default:
    the vendored VADER test split. Returns (token lists, source description)."""
    window = min(window, context) if context else window
    if texts is not None:
        return token_lists(texts, tokenizer, context, window), "given texts"
    if path is not None and Path(path).suffix == ".txt":
        if not Path(path).is_file():
            raise InputError(f"perplexity text not found: {path}")
        lists = stream_windows(Path(path).read_text(encoding="utf-8"), tokenizer, window)
        if limit:
            lists = lists[:limit]
        source = f"{path} ({window}-token windows)"
    else:
        dataset = load_text_dataset(Path(path) if path else vader_split_path("test"), label_column="", limit=limit, seed=seed)
        lists = token_lists(dataset.texts, tokenizer, context, window)
        source = dataset.source
    if not lists:
        raise InputError(f"no text of at least 2 tokens to score perplexity on in {path or 'the held-out split'}")
    return lists, source


def text_nll(logits: np.ndarray, ids) -> tuple[float, int]:
    """Summed NLL of ``ids[1:]`` under ``logits`` (tokens, vocab; position t predicts t+1) and the
    number of tokens predicted: the one scoring rule of every perplexity xformopt reports."""
    targets = np.asarray(ids, dtype=np.int64)[1:]
    logp = log_softmax(logits[: len(targets)])
    return float(-logp[np.arange(len(targets)), targets].sum()), len(targets)


def nll_per_text(runner, lists: list[list[int]]) -> np.ndarray:
    """(texts, 2): summed negative log-likelihood and number of predicted tokens per text."""
    rows = []
    for ids in lists:
        logits, _ = runner.forward(np.asarray(ids, dtype=np.int64)[None], None, use_cache=False)
        rows.append(text_nll(logits[0], ids))
    return np.asarray(rows, dtype=np.float64)


def summarize(rows: np.ndarray, seed: int = 0) -> dict:
    """Perplexity with a bootstrap 95% interval over texts (the shape report metrics take)."""
    nll, count = rows[:, 0], rows[:, 1]
    value = float(np.exp(nll.sum() / count.sum()))
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(rows), size=(BOOTSTRAP, len(rows)))
    boot = np.exp(nll[picks].sum(axis=1) / count[picks].sum(axis=1))
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return {"value": value, "ci95": [float(lo), float(hi)], "n": int(count.sum()), "texts": int(len(rows))}


def perplexity(runner, lists: list[list[int]], seed: int = 0) -> dict:
    return summarize(nll_per_text(runner, lists), seed)
