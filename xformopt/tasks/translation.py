"""translation: encoder-decoder models (Marian, T5, BART/mBART) scored by corpus BLEU and chrF
(sacreBLEU) against reference translations."""

from __future__ import annotations

from xformopt.scoring.text_generation import bleu, chrf
from xformopt.tasks.base import Metric
from xformopt.tasks.text2text import SHARED_METRICS, Text2Text


class Translation(Text2Text):
    name = "translation"
    summary = "encoder-decoder translation (Marian, T5, BART/mBART): BLEU and chrF, greedy or beam search"
    headline = "bleu"
    metrics = {"bleu": Metric("BLEU", bounds=(0.0, 100.0)), "chrf": Metric("chrF", bounds=(0.0, 100.0)),
               **SHARED_METRICS}
    default_set = "reverse"

    def reference_metrics(self, hypotheses, references, seed):
        return {"bleu": bleu(hypotheses, references, seed), "chrf": chrf(hypotheses, references, seed)}


TASK = Translation()
