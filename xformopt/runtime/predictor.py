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

from xformopt import models, tasks
from xformopt.errors import InputError
from xformopt.runtime import per_token_int8
from xformopt.runtime.encoder import OrtPredictor
from xformopt.tasks.base import pad_rows
from xformopt.tasks.heads import FEATURES, Prepared, Row, check_texts, is_pair


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
    def head(self):
        """The task's head (xformopt/tasks/heads.py): how inputs become rows and rows an answer."""
        return tasks.get(self.task).head

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

    def prepare(self, inputs: Sequence, truncate: bool | str = True) -> list[Prepared]:
        """Every input tokenized (one fast-tokenizer call per kind of input). An input longer than
        ``max_length`` tokens is cut at its end (``truncate=True`` or ``"right"``), at its start (``"left"``,
        TEI's ``truncation_direction``), or refused (``False``)."""
        if not (isinstance(truncate, bool) or truncate in ("left", "right")):
            raise InputError(f"truncate={truncate!r}: pass True (cut the end), \"left\" (cut the start) or False "
                             "(refuse over-long inputs)")
        return self.head.prepare(self, list(inputs), True if truncate == "right" else truncate)

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
        return self.head.finish(self, prepared, outputs, **options)

    # ------------------------------------------------------------------ whole calls

    def _run(self, inputs: Sequence, batch_size: int, truncate: bool | str, **options) -> list:
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
              truncate: bool | str = True) -> np.ndarray:
        """Sentence embeddings (rows, width) float32; ``normalize=None``: as the model's modules say."""
        if not self.head.embeds:
            raise InputError(f"{self.path} is a {self.task} model; embed() needs a feature-extraction artifact "
                             "(use predict())")
        texts = [texts] if isinstance(texts, str) else list(texts)
        if not texts:
            return np.zeros((0, self.spec.hidden_size), dtype=np.float32)
        check_texts(texts)
        return np.stack(self._run(texts, batch_size, truncate, normalize=normalize)).astype(np.float32)

    def predict(self, inputs, batch_size: int = 32, truncate: bool | str = True, raw_scores: bool = False, *,
                pairs: Sequence[str] | None = None) -> list:
        """The task's answer per input (see the module docstring); one input (not in a list) gives one answer.

        Text pairs (text-classification) are tuples, ``("a text", "its pair")``, or ``pairs=``, one
        second text per input: a list is always a batch, so ``predict(["a", "b"])`` is two texts."""
        if pairs is not None:
            if not self.head.pairs:
                raise InputError(f"pairs= is for text-classification models; this is a {self.task} model")
            texts = [inputs] if isinstance(inputs, str) else list(inputs)
            seconds = [pairs] if isinstance(pairs, str) else list(pairs)
            if len(texts) != len(seconds):
                raise InputError(f"{len(texts)} texts but {len(seconds)} pairs; give one pair per text")
            zipped = list(zip(texts, seconds))
            inputs = zipped[0] if isinstance(inputs, str) else zipped
        single = isinstance(inputs, (str, dict)) or (self.head.pairs and is_pair(inputs))
        items = [inputs] if single else list(inputs)
        if self.head.embeds:
            vectors = [v.tolist() for v in self.embed(items, batch_size, truncate=truncate)]
            return vectors[0] if single else vectors
        answers = self._run(items, batch_size, truncate, raw_scores=raw_scores)
        return answers[0] if single else answers


SERVED_TASKS = tasks.served()


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
    spec = models.stage_spec(models.describe(path, task), path)
    if spec.task not in SERVED_TASKS:
        raise InputError(f"{path} is a {spec.task} model; the predictor serves {', '.join(SERVED_TASKS)}")
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
    pooling = Pooling.read(path) if tasks.get(spec.task).head.embeds else Pooling()
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
