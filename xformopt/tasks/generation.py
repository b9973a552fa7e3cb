"""text-generation: causal decoders exported with a KV cache; metric perplexity on held-out text
(evaluated by xformopt.decoder.evaluate: cached-step latency, generation grid)."""

from __future__ import annotations

from xformopt.data import load_text_dataset
from xformopt.tasks.base import Metric, Task, argmax_agreement


class TextGeneration(Task):
    name = "text-generation"
    summary = "causal language models with a KV cache (GPT-2, Llama, Qwen, Mistral, Phi-3)"
    auto_model = "AutoModelForCausalLM"
    head_may_be_fresh = False
    export_outputs = ("logits",)
    architectures = ("ForCausalLM", "LMHeadModel")
    headline = "perplexity"
    metrics = {"perplexity": Metric("Perplexity", lower_is_better=True, bounds=(1.0, float("inf"))),
               "next_token_agreement": Metric("Next-token agr.", percent=True, relative=True)}
    graph = "decoder"
    refuses = {
        "profile": "`xformopt profile` profiles encoder graphs only: use `xformopt bench` for time to first token and "
                   "per-token latency",
        "search": "xformopt search covers encoders (text-classification, feature-extraction)",
        "gate": "the regression gate is not available for text-generation artifacts yet; run `xformopt bench` without "
                "it (the generation benchmark)",
    }
    int8_calibration = False  # the graph takes past key/values: calibration readers and the budget feed none
    passes = ("export", "fuse", "quantize", "int4")  # prune and distill reach encoder modules only

    def load(self, path, *, label2id, limit, seed, columns=None, require_labels=None):
        return load_text_dataset(path, text_column=(columns or {}).get("text"), label_column="", limit=limit, seed=seed)

    def score(self, outputs, baseline, data, seed=0):
        raise NotImplementedError("text-generation is scored by xformopt.decoder.evaluate (perplexity)")

    def agreement(self, outputs, reference):
        return argmax_agreement(outputs, reference)


TASK = TextGeneration()
