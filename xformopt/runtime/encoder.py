"""Run one encoder stage (the PyTorch model or an ONNX graph) on raw texts, tokenization included.

Every stage is evaluated and timed through the same interface, so the PyTorch baseline and each
ONNX stage see identical tokenization, identical pooling and identical thread settings.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from xformopt.models import ModelSpec, load_tokenizer, load_torch_model
from xformopt.runtime.session import ort_feed, ort_session

MAX_LENGTH = 512


class Predictor:
    """texts -> the task's per-row outputs (logits, pooled embeddings, ...: ``spec.task_def.finish``)."""

    def __init__(self, spec: ModelSpec, tokenizer, max_length: int = MAX_LENGTH):
        self.spec = spec
        self.task = spec.task_def
        self.tokenizer = tokenizer
        self.max_length = min(max_length, getattr(tokenizer, "model_max_length", max_length) or max_length)

    def tokenize(self, texts: Sequence[str], pairs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """A batch as the graph takes it, the task's way (``Task.encode``: 3-D for multiple choice, ...)."""
        return self.task.encode(self.tokenizer, texts, pairs, self.max_length)

    def raw_outputs(self, encoded: dict[str, np.ndarray]) -> np.ndarray:
        """The graph's outputs as the task combines them (logits, token states, start/end logits):
        what export parity compares."""
        raise NotImplementedError

    def run_encoded(self, encoded: dict[str, np.ndarray]) -> np.ndarray:
        return self.task.finish(self.raw_outputs(encoded), encoded)

    def predict_data(self, data, batch_size: int = 32, progress: Callable[[int, int], None] | None = None) -> np.ndarray:
        """The task's outputs for every row of a TextDataset (tokenised the task's way: words, strides, ...)."""
        return self.task.predict(self, data, batch_size=batch_size, progress=progress)

    def __call__(self, texts: Sequence[str], pairs: Sequence[str] | None = None) -> np.ndarray:
        return self.run_encoded(self.tokenize(texts, pairs))

    def predict(self, texts: Sequence[str], pairs: Sequence[str] | None = None, batch_size: int = 32,
                progress: Callable[[int, int], None] | None = None) -> np.ndarray:
        """Outputs for every text; ``progress(rows done, rows)`` after each batch."""
        # Sort by length so each batch pads little; restore the caller's order at the end.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out: list[np.ndarray] = []
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            out.append(self(
                [texts[i] for i in idx],
                [pairs[i] for i in idx] if pairs is not None else None,
            ))
            if progress is not None:
                progress(start + len(idx), len(order))
        result = np.concatenate(out, axis=0)
        restored = np.empty_like(result)
        restored[order] = result
        return restored


class TorchPredictor(Predictor):
    def __init__(self, spec: ModelSpec, model_dir: Path | None = None, threads: int | None = None):
        import torch

        if threads:
            torch.set_num_threads(threads)
        model_dir = model_dir or spec.path
        super().__init__(spec, load_tokenizer(model_dir, spec.trust_remote_code))
        self.model = load_torch_model(spec, model_dir)
        self._torch = torch
        # Feed only what forward() takes: e.g. a DistilBERT saved with a BERT tokenizer gets no token_type_ids.
        self.accepts = set(inspect.signature(self.model.forward).parameters)

    def raw_outputs(self, encoded):
        with self._torch.inference_mode():
            inputs = {k: self._torch.from_numpy(v) for k, v in encoded.items() if k in self.accepts}
            outputs = self.model(**inputs).to_tuple()
            return self.task.combine([o.float().numpy() for o in outputs if hasattr(o, "float")])


class OrtPredictor(Predictor):
    def __init__(self, spec: ModelSpec, model_dir: Path, threads: int | None = None, tokenizer_dir: Path | None = None,
                 disabled_optimizers=()):
        super().__init__(spec, load_tokenizer(tokenizer_dir or model_dir, spec.trust_remote_code))
        self.session = ort_session(model_dir / "model.onnx", threads, disabled_optimizers=disabled_optimizers)
        self.input_names = [i.name for i in self.session.get_inputs()]

    def raw_outputs(self, encoded):
        return self.task.combine(self.session.run(None, ort_feed(encoded, self.input_names)))
