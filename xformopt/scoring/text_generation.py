"""Metrics of generated text against references: corpus BLEU and chrF (sacreBLEU), ROUGE-1/2/L F1
(Google's rouge-score), each with a seeded bootstrap 95% interval over sentences.

sacreBLEU is the reference implementation papers quote (its default 13a tokenization, so scores are
comparable with theirs); corpus BLEU is not a mean of sentence scores, so its interval resamples the
sentences and recomputes the corpus score (sacreBLEU's own bootstrap is for paired comparisons).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from xformopt.errors import InputError
from xformopt.scoring.metrics import mean_with_bootstrap

RESAMPLES = 200


def _need(module: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        package = {"sacrebleu": "sacrebleu", "rouge_score": "rouge-score"}[module.split(".")[0]]
        raise InputError(f"scoring generated text needs {package}, a dependency of xformopt: pip install {package}") from None


def _corpus(metric, hypotheses: Sequence[str], references: Sequence[str], seed: int) -> dict:
    hyps, refs = list(hypotheses), list(references)
    n = len(hyps)
    value = float(metric.corpus_score(hyps, [refs]).score)
    rng = np.random.default_rng(seed)
    boot = []
    for _ in range(RESAMPLES):
        pick = rng.integers(0, n, n)
        boot.append(metric.corpus_score([hyps[i] for i in pick], [[refs[i] for i in pick]]).score)
    return {"value": value, "n": n, "ci95": [float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))]}


def require() -> None:
    """Fail in a second, before any work, where a metric package is missing."""
    _need("sacrebleu")
    _need("rouge_score.rouge_scorer")


def bleu(hypotheses: Sequence[str], references: Sequence[str], seed: int = 0) -> dict:
    """Corpus BLEU (0-100), sacreBLEU defaults."""
    sacrebleu = _need("sacrebleu")
    return _corpus(sacrebleu.metrics.BLEU(), hypotheses, references, seed)


def chrf(hypotheses: Sequence[str], references: Sequence[str], seed: int = 0) -> dict:
    """Corpus chrF (0-100), sacreBLEU defaults."""
    sacrebleu = _need("sacrebleu")
    return _corpus(sacrebleu.metrics.CHRF(), hypotheses, references, seed)


def rouge(hypotheses: Sequence[str], references: Sequence[str], seed: int = 0) -> dict[str, dict]:
    """ROUGE-1, ROUGE-2 and ROUGE-L F1 (0-1), per sentence then averaged, with bootstrap intervals."""
    scorer = _need("rouge_score.rouge_scorer").RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    rows = [scorer.score(ref, hyp) for hyp, ref in zip(hypotheses, references)]
    return {name: mean_with_bootstrap(np.array([r[name].fmeasure for r in rows]), seed)
            for name in ("rouge1", "rouge2", "rougeL")}


def same_text(hypotheses: Sequence[str], baseline: Sequence[str]) -> np.ndarray:
    """1.0 where a row's output equals the baseline model's, per row."""
    return np.array([h == b for h, b in zip(hypotheses, baseline)], dtype=np.float64)
