"""summarization: encoder-decoder models (BART, T5) scored by ROUGE-1/2/L F1 against reference summaries."""

from __future__ import annotations

from xformopt.scoring.text_generation import rouge
from xformopt.tasks.base import Metric
from xformopt.tasks.text2text import SHARED_METRICS, Text2Text


class Summarization(Text2Text):
    name = "summarization"
    summary = "encoder-decoder summarization (BART, T5): ROUGE-1/2/L, greedy or beam search"
    architectures = ()  # never detected: a ForConditionalGeneration checkpoint is translation unless --task says
    headline = "rougeL"
    metrics = {"rougeL": Metric("ROUGE-L", percent=True), "rouge1": Metric("ROUGE-1", percent=True),
               "rouge2": Metric("ROUGE-2", percent=True), **SHARED_METRICS}
    default_set = "lead"

    def reference_metrics(self, hypotheses, references, seed):
        return rouge(hypotheses, references, seed)


TASK = Summarization()
