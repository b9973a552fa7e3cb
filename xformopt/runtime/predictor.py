"""Task-level predictions from an artifact directory: what ``xformopt.load(ARTIFACT)`` returns and
what ``xformopt serve`` runs.

``load_predictor(artifact_dir)`` opens the artifact's ONNX graph (:class:`~xformopt.runtime.encoder.OrtPredictor`)
and answers in the shapes users already know:

- ``embed(texts)``: sentence embeddings, pooled and normalized as the model's sentence-transformers
  modules say (``modules.json``, ``1_Pooling/config.json``, a ``Normalize`` module, ``max_seq_length``);
- ``predict(inputs)``: text-classification ``[{label, score}]`` sorted per input (text pairs as
  tuples ``(a, b)`` or ``pairs=``; a list is always a batch); token-classification entities as transformers' ``pipeline(aggregation_strategy="simple")``
  returns them; question-answering ``{answer, score, start, end}`` from ``{question, context}`` inputs
  (long contexts in overlapping windows, as the QA task evaluates the artifact).

The work is split in three steps so that a server can batch across requests: ``prepare`` tokenizes
many inputs in one fast-tokenizer call into :class:`Row` objects (one per sequence the graph sees: a QA
context may need several windows), ``run_rows`` feeds any rows as one padded session call and returns
each row's own outputs, and ``finish`` turns one input's row outputs into its answer. ``predict`` and
``embed`` are those three steps over length-sorted chunks of ``batch_size`` rows.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from xformopt import models
from xformopt.errors import InputError
from xformopt.runtime import per_token_int8
from xformopt.runtime.encoder import OrtPredictor
from xformopt.tasks.base import pad_rows
from xformopt.tasks.question_answering import (
    DOC_STRIDE,
    MAX_LENGTH,
    best_answer,
    question_windows,
    window_spans,
)

FEATURES = ("input_ids", "attention_mask", "token_type_ids")


@dataclass
class Row:
    """One sequence the graph sees: its unpadded token features (1-D id lists)."""

    features: dict[str, list[int]]

    @property
    def length(self) -> int:
        return len(self.features["input_ids"])


@dataclass
class Prepared:
    """One input, tokenized: its rows and what ``finish`` needs besides their outputs."""

    rows: list[Row]
    context: Any = None


@dataclass
class Pooling:
    """How sentence-transformers turns token states into one embedding (its Pooling + Normalize modules)."""

    mode: str = "mean"  # mean | cls | max | mean_sqrt_len | lasttoken
    normalize: bool = False
    max_length: int | None = None  # sentence_bert_config.json max_seq_length

    MODES = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean", "pooling_mode_max_tokens": "max",
             "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len", "pooling_mode_lasttoken": "lasttoken"}

    @classmethod
    def read(cls, model_dir: Path) -> Pooling:
        """The model's own pooling; mean pooling (what the feature-extraction task scores) without modules.json."""
        model_dir = Path(model_dir)
        try:
            modules = json.loads((model_dir / "modules.json").read_text(encoding="utf-8"))
        except FileNotFoundError:
            return cls()
        except (OSError, ValueError):
            raise InputError(f"{model_dir / 'modules.json'} is not valid JSON; fix or remove it") from None
        pooling = cls()
        for module in modules if isinstance(modules, list) else []:
            kind = str(module.get("type", "")).rsplit(".", 1)[-1] if isinstance(module, dict) else ""
            if kind == "Pooling":
                config = _json_or_empty(model_dir / str(module.get("path", "")) / "config.json")
                modes = [mode for key, mode in cls.MODES.items() if config.get(key)]
                if len(modes) > 1:
                    raise InputError(f"{model_dir}: the Pooling module concatenates {modes}; xformopt serves one "
                                     "pooling mode per model")
                pooling.mode = modes[0] if modes else "mean"
            elif kind == "Normalize":
                pooling.normalize = True
            elif kind not in ("Transformer", ""):
                raise InputError(f"{model_dir}: sentence-transformers module {kind!r} is not in the ONNX graph; "
                                 "xformopt serves Transformer + Pooling (+ Normalize) models")
        max_length = _json_or_empty(model_dir / "sentence_bert_config.json").get("max_seq_length")
        pooling.max_length = max_length if isinstance(max_length, int) and max_length > 0 else None
        return pooling

    def __call__(self, states: np.ndarray) -> np.ndarray:
        """One row's unpadded token states (tokens, width) -> its embedding (width,)."""
        if self.mode == "cls":
            return states[0]
        if self.mode == "lasttoken":
            return states[-1]
        if self.mode == "max":
            return states.max(axis=0)
        total = states.sum(axis=0)
        return total / (np.sqrt(len(states)) if self.mode == "mean_sqrt_len" else len(states))


def _json_or_empty(path: Path) -> dict:
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def l2_normalize(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.clip(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12, None)


@dataclass
class Predictor:
    """An artifact's model, answering at the task level (see the module docstring)."""

    path: Path
    runner: OrtPredictor
    pooling: Pooling = field(default_factory=Pooling)
    multi_label: bool = False  # config.problem_type multi_label_classification: sigmoid per label

    @property
    def task(self) -> str:
        return self.runner.spec.task

    @property
    def spec(self):
        return self.runner.spec

    @property
    def tokenizer(self):
        return self.runner.tokenizer

    @property
    def max_length(self) -> int:
        """Tokens per sequence: the sentence-transformers max_seq_length for embedders, else the model's limit."""
        limit = self.runner.max_length
        return min(limit, self.pooling.max_length) if self.pooling.max_length else limit

    @property
    def labels(self) -> dict[int, str]:
        return self.spec.id2label or {}

    # ------------------------------------------------------------------ the three steps

    def prepare(self, inputs: Sequence, truncate: bool = True) -> list[Prepared]:
        """Every input tokenized (one fast-tokenizer call per kind of input); ``truncate=False``
        refuses an input longer than ``max_length`` tokens instead of cutting it."""
        return _HEADS[self.task].prepare(self, list(inputs), truncate)

    def run_rows(self, rows: Sequence[Row]) -> list[np.ndarray]:
        """One padded session call over ``rows``; each row's own outputs, padding removed."""
        rows = list(rows)
        features = [{k: v for k, v in r.features.items() if k in FEATURES} for r in rows]
        raw = self.runner.raw_outputs(pad_rows(self.tokenizer, features))
        if raw.ndim == 2:  # one vector per row (classification logits)
            return [raw[i] for i in range(len(rows))]
        right = self.tokenizer.padding_side == "right"
        return [raw[i, :r.length] if right else raw[i, raw.shape[1] - r.length:] for i, r in enumerate(rows)]

    def finish(self, prepared: Prepared, outputs: list[np.ndarray], **options) -> Any:
        """One input's answer from its rows' outputs (``options``: normalize, raw_scores)."""
        return _HEADS[self.task].finish(self, prepared, outputs, **options)

    # ------------------------------------------------------------------ whole calls

    def _run(self, inputs: Sequence, batch_size: int, truncate: bool, **options) -> list:
        if batch_size < 1:
            raise InputError(f"batch_size must be at least 1, got {batch_size}")
        prepared = self.prepare(inputs, truncate)
        rows = [(i, j) for i, p in enumerate(prepared) for j in range(len(p.rows))]
        # Sorted by length so each chunk pads little; every row's output goes back to its input.
        rows.sort(key=lambda ij: prepared[ij[0]].rows[ij[1]].length)
        outputs: list[list] = [[None] * len(p.rows) for p in prepared]
        for start in range(0, len(rows), batch_size):
            chunk = rows[start:start + batch_size]
            for (i, j), out in zip(chunk, self.run_rows([prepared[i].rows[j] for i, j in chunk])):
                outputs[i][j] = out
        return [self.finish(p, o, **options) for p, o in zip(prepared, outputs)]

    def embed(self, texts: str | Sequence[str], batch_size: int = 32, normalize: bool | None = None,
              truncate: bool = True) -> np.ndarray:
        """Sentence embeddings (rows, width) float32; ``normalize=None``: as the model's modules say."""
        if self.task != "feature-extraction":
            raise InputError(f"{self.path} is a {self.task} model; embed() needs a feature-extraction artifact "
                             "(use predict())")
        texts = [texts] if isinstance(texts, str) else list(texts)
        if not texts:
            return np.zeros((0, self.spec.hidden_size), dtype=np.float32)
        _check_texts(texts)
        return np.stack(self._run(texts, batch_size, truncate, normalize=normalize)).astype(np.float32)

    def predict(self, inputs, batch_size: int = 32, truncate: bool = True, raw_scores: bool = False, *,
                pairs: Sequence[str] | None = None) -> list:
        """The task's answer per input (see the module docstring); one input (not in a list) gives one answer.

        Text pairs (text-classification) are tuples, ``("a text", "its pair")``, or ``pairs=``, one
        second text per input: a list is always a batch, so ``predict(["a", "b"])`` is two texts."""
        if pairs is not None:
            if self.task != "text-classification":
                raise InputError(f"pairs= is for text-classification models; this is a {self.task} model")
            texts = [inputs] if isinstance(inputs, str) else list(inputs)
            seconds = [pairs] if isinstance(pairs, str) else list(pairs)
            if len(texts) != len(seconds):
                raise InputError(f"{len(texts)} texts but {len(seconds)} pairs; give one pair per text")
            zipped = list(zip(texts, seconds))
            inputs = zipped[0] if isinstance(inputs, str) else zipped
        single = isinstance(inputs, (str, dict)) or (self.task == "text-classification" and _is_pair(inputs))
        items = [inputs] if single else list(inputs)
        if self.task == "feature-extraction":
            vectors = [v.tolist() for v in self.embed(items, batch_size, truncate=truncate)]
            return vectors[0] if single else vectors
        answers = self._run(items, batch_size, truncate, raw_scores=raw_scores)
        return answers[0] if single else answers


def _is_pair(value) -> bool:
    """A (text, text_pair) tuple. Lists are batches, never pairs: ``["a", "b"]`` is two texts (the HTTP
    route turns TEI's ``[a, b]`` into a tuple before it gets here)."""
    return isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, str) for v in value)


def _check_texts(texts: list) -> None:
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise InputError(f"input {i} is a {type(text).__name__}, not a string; pass texts")


def _tokenize(predictor: Predictor, texts: list[str], pairs: list[str] | None, truncate: bool, **extra):
    """One fast-tokenizer call; with ``truncate=False`` an over-long input is an InputError naming it."""
    limit = predictor.max_length
    encoded = predictor.tokenizer(texts, pairs, truncation=bool(truncate),
                                  max_length=limit if truncate else None, **extra)
    if not truncate:
        for i, ids in enumerate(encoded["input_ids"]):
            if len(ids) > limit:
                raise InputError(f"input {i} has {len(ids)} tokens, more than the model's {limit}; shorten it or "
                                 "allow truncation (truncate: true)")
    return encoded


def _rows(encoded, i: int) -> Row:
    return Row({k: list(encoded[k][i]) for k in FEATURES if k in encoded})


# --------------------------------------------------------------------------- per-task heads


class _Embeddings:
    @staticmethod
    def prepare(predictor, texts, truncate):
        _check_texts(texts)
        encoded = _tokenize(predictor, texts, None, truncate)
        return [Prepared([_rows(encoded, i)]) for i in range(len(texts))]

    @staticmethod
    def finish(predictor, prepared, outputs, normalize=None, **_):
        vector = predictor.pooling(outputs[0].astype(np.float32))
        return l2_normalize(vector) if (predictor.pooling.normalize if normalize is None else normalize) else vector


class _Classification:
    @staticmethod
    def prepare(predictor, inputs, truncate):
        singles = [i for i, x in enumerate(inputs) if isinstance(x, str)]
        pairs = [i for i, x in enumerate(inputs) if _is_pair(x)]
        bad = sorted(set(range(len(inputs))) - set(singles) - set(pairs))
        if bad:
            hint = (" (a list is a batch: pass a pair as a tuple (text, text_pair), or use pairs=)"
                    if isinstance(inputs[bad[0]], list) else "")
            raise InputError(f"input {bad[0]} is neither a text nor a (text, text_pair) tuple of strings{hint}")
        out: list[Prepared | None] = [None] * len(inputs)
        if singles:
            encoded = _tokenize(predictor, [inputs[i] for i in singles], None, truncate)
            for k, i in enumerate(singles):
                out[i] = Prepared([_rows(encoded, k)])
        if pairs:
            encoded = _tokenize(predictor, [inputs[i][0] for i in pairs], [inputs[i][1] for i in pairs], truncate)
            for k, i in enumerate(pairs):
                out[i] = Prepared([_rows(encoded, k)])
        return out

    @staticmethod
    def finish(predictor, prepared, outputs, raw_scores=False, **_):
        logits = outputs[0].astype(np.float64)
        if raw_scores:
            scores = logits
        elif len(logits) == 1 or predictor.multi_label:
            scores = 1.0 / (1.0 + np.exp(-logits))  # the pipeline's sigmoid for one-logit heads
        else:
            shifted = np.exp(logits - logits.max())
            scores = shifted / shifted.sum()
        names = predictor.labels
        ranked = sorted(range(len(scores)), key=lambda k: -scores[k])
        return [{"label": names.get(k, f"LABEL_{k}"), "score": float(scores[k])} for k in ranked]


class _Tokens:
    @staticmethod
    def prepare(predictor, texts, truncate):
        _check_texts(texts)
        encoded = _tokenize(predictor, texts, None, truncate, return_special_tokens_mask=True,
                            return_offsets_mapping=True)
        return [Prepared([_rows(encoded, i)], {"text": texts[i], "offsets": np.asarray(encoded["offset_mapping"][i]),
                                               "special": np.asarray(encoded["special_tokens_mask"][i])})
                for i in range(len(texts))]

    @staticmethod
    def finish(predictor, prepared, outputs, **_):
        from transformers.pipelines.token_classification import AggregationStrategy

        logits = outputs[0].astype(np.float32)
        shifted = np.exp(logits - logits.max(-1, keepdims=True))
        scores = shifted / shifted.sum(-1, keepdims=True)
        pipeline = _pipeline_postprocessor(predictor)
        ids = np.asarray(prepared.rows[0].features["input_ids"])
        context = prepared.context
        pre = pipeline.gather_pre_entities(context["text"], ids, scores, context["offsets"], context["special"],
                                           AggregationStrategy.SIMPLE)
        entities = pipeline.aggregate(pre, AggregationStrategy.SIMPLE)
        return [{"entity_group": e["entity_group"], "score": float(e["score"]), "word": e["word"],
                 "start": int(e["start"]), "end": int(e["end"])}
                for e in entities if e.get("entity_group") != "O"]


def _pipeline_postprocessor(predictor):
    """transformers' TokenClassificationPipeline as a postprocessor only (no model): its entity
    gathering and "simple" aggregation are reused as they are, so served entities are the pipeline's."""
    cached = getattr(predictor, "_token_pipeline", None)
    if cached is None:
        from types import SimpleNamespace

        from transformers import TokenClassificationPipeline

        cached = TokenClassificationPipeline.__new__(TokenClassificationPipeline)
        cached.tokenizer = predictor.tokenizer
        cached.framework = "np"  # offsets are numpy already (the pipeline calls .item() on torch ones)
        cached.model = SimpleNamespace(config=SimpleNamespace(id2label=predictor.labels))
        object.__setattr__(predictor, "_token_pipeline", cached)
    return cached


class _Answers:
    @staticmethod
    def prepare(predictor, inputs, truncate):

        max_length = min(MAX_LENGTH, predictor.max_length)
        stride = min(max_length // 2, DOC_STRIDE)
        out = []
        for i, item in enumerate(inputs):
            if not (isinstance(item, dict) and isinstance(item.get("question"), str)
                    and isinstance(item.get("context"), str) and item["question"].strip() and item["context"].strip()):
                raise InputError(f"input {i} needs a non-empty 'question' and 'context' (strings)")
            # one tokenizer call per input: its windows depend on its own question's length
            windows = question_windows(predictor.tokenizer, i, item["question"], item["context"], max_length, stride,
                                       f"input {i}")
            rows = [Row({k: list(v) for k, v in w["inputs"].items() if k in FEATURES}) for w in windows]
            out.append(Prepared(rows, {"windows": windows, "context": item["context"]}))
        return out

    @staticmethod
    def finish(predictor, prepared, outputs, **_):

        spans = [window_spans(w, o) for w, o in zip(prepared.context["windows"], outputs)]
        start, end, score = best_answer(prepared.context["context"], spans)
        if start < 0:
            return {"answer": "", "score": 0.0, "start": -1, "end": -1}
        return {"answer": prepared.context["context"][int(start):int(end)], "score": float(score),
                "start": int(start), "end": int(end)}


_HEADS = {"feature-extraction": _Embeddings, "text-classification": _Classification,
          "token-classification": _Tokens, "question-answering": _Answers}
SERVED_TASKS = tuple(_HEADS)


def artifact_spec(artifact_dir: str | Path):
    """The artifact's ModelSpec (task from its manifest, else its config), checked to be servable,
    without opening the model; a one-line InputError otherwise."""

    path = Path(artifact_dir)
    if not path.is_dir():
        raise InputError(f"artifact not found: {path}; pass the -o folder of `xformopt optimize`")
    if not (path / "model.onnx").is_file():
        raise InputError(f"{path} has no model.onnx; pass an ONNX artifact (the -o folder of `xformopt optimize`)")
    if not (path / "tokenizer.json").is_file():
        raise InputError(f"{path} has no tokenizer.json; the artifact is incomplete, re-run optimize")
    manifest = _json_or_empty(path / "manifest.json")
    task = (manifest.get("input") or {}).get("task") if isinstance(manifest.get("input"), dict) else None
    spec = models.stage_spec(models.resolve(str(path), task), path)
    if spec.task not in _HEADS:
        raise InputError(f"{path} is a {spec.task} model; the predictor serves {', '.join(_HEADS)}")
    return spec


INT8_SCALES = ("per-token", "per-tensor")


def load_predictor(artifact_dir: str | Path, threads: int | None = None, int8_scales: str = "per-token",
                   int8_attention: str = per_token_int8.DEFAULT_ATTENTION) -> Predictor:
    """The artifact's model (an `xformopt optimize` output, or any stage with model.onnx, config.json
    and tokenizer.json), ready to answer; a one-line InputError when it cannot be served.

    ``int8_scales``: for a dynamic-INT8 graph, "per-token" (default) quantizes each token's activations
    with its own scale (xformopt.runtime.per_token_int8: MatMulInteger inputs, fused QAttention and
    DynamicQuantizeMatMul), so an answer does not depend on its batch mates; "per-tensor" runs the
    graph as exported (one scale per batch: batch-dependent). ``int8_attention``: how a fused
    QAttention is made batch-independent ("per-token" INT8 QKV projection or "float" QKV weights)."""
    import tempfile

    if int8_scales not in INT8_SCALES:
        raise InputError(f"int8_scales {int8_scales!r}: choose one of {', '.join(INT8_SCALES)}")
    if int8_attention not in per_token_int8.ATTENTION_MODES:
        raise InputError(f"int8_attention {int8_attention!r}: choose one of {', '.join(per_token_int8.ATTENTION_MODES)}")
    path = Path(artifact_dir)
    spec = artifact_spec(path)
    pooling = Pooling.read(path) if spec.task == "feature-extraction" else Pooling()
    if int8_scales == "per-token" and per_token_int8.has_dynamic_int8(path / "model.onnx"):
        # the rewrite lives only until the session has read it; the artifact is never touched
        with tempfile.TemporaryDirectory(prefix="xformopt-per-token-") as scratch:
            per_token_int8.rewritten_copy(path / "model.onnx", Path(scratch), int8_attention)
            runner = OrtPredictor(spec, Path(scratch), threads=threads, tokenizer_dir=path,
                                  disabled_optimizers=per_token_int8.DISABLED_OPTIMIZERS)
    else:
        runner = OrtPredictor(spec, path, threads=threads)
    multi_label = _json_or_empty(path / "config.json").get("problem_type") == "multi_label_classification"
    return Predictor(path, runner, pooling, multi_label)
