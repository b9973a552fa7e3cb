"""A text-ranking artifact inside sentence-transformers as a ``CrossEncoder``: its one module runs the
artifact's model.onnx with ONNX Runtime and hands the logits on as the pair scores, so ``predict`` and
``rank`` answer as the original cross-encoder did (the sigmoid of the logit for one-output models, or
the activation the model's config.json names), at the artifact's speed.

sentence-transformers' own ``backend="onnx"`` needs optimum-onnx, which cannot be installed beside
sentence-transformers 6 (see xformopt/clients/sentence_transformers_module.py for the embedder's route)::

    from xformopt.clients.cross_encoder_module import onnx_cross_encoder

    model = onnx_cross_encoder("out")                    # a CrossEncoder
    scores = model.predict([("a query", "a passage"), ("a query", "another")])
    ranked = model.rank("a query", ["a passage", "another"])
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sentence_transformers import CrossEncoder
from sentence_transformers.base.modules import InputModule

from xformopt.errors import InputError
from xformopt.runtime.predictor import load_predictor


class OnnxPairScorer(InputModule):
    """(text, text_pair) pairs tokenized together and scored by the artifact's graph: ``features["scores"]``."""

    def __init__(self, artifact: str | Path, threads: int | None = None, int8_scales: str = "per-token"):
        super().__init__()
        predictor = load_predictor(Path(artifact), threads=threads, int8_scales=int8_scales)
        self.runner, self.tokenizer, self.max_seq_length = predictor.runner, predictor.tokenizer, predictor.max_length

    def preprocess(self, inputs: Sequence[Any], prompt: str | None = None, **kwargs) -> dict[str, torch.Tensor]:
        pairs = [tuple(p) if isinstance(p, (list, tuple)) else (p, None) for p in inputs]
        firsts = [(prompt or "") + first for first, _ in pairs]
        seconds = [second for _, second in pairs]
        return dict(self.tokenizer(firsts, None if None in seconds else seconds, padding=True, truncation=True,
                                   max_length=self.max_seq_length, return_tensors="pt"))

    def forward(self, features: dict[str, Any], **kwargs) -> dict[str, Any]:
        encoded = {name: np.asarray(value) for name, value in features.items() if isinstance(value, torch.Tensor)}
        features["scores"] = torch.from_numpy(np.asarray(self.runner.raw_outputs(encoded), dtype=np.float32))
        return features

    def save(self, output_path: str, *args, **kwargs) -> None:
        raise NotImplementedError("an ONNX cross-encoder is saved as the xformopt artifact itself")


def onnx_cross_encoder(artifact: str | Path, threads: int | None = None, int8_scales: str = "per-token") -> CrossEncoder:
    """A ``CrossEncoder`` whose model is the artifact's ONNX graph (a text-ranking artifact: one output)."""
    artifact = Path(artifact)
    scorer = OnnxPairScorer(artifact, threads, int8_scales)
    config = _config(artifact)
    if len(config.get("id2label") or {0: ""}) != 1:
        raise InputError(f"{artifact} has {len(config['id2label'])} outputs; a CrossEncoder drop-in takes a one-output "
                         "reranker (use xformopt.load() or transformers_pipeline for a classifier)")
    return CrossEncoder(modules=[scorer], device="cpu", activation_fn=_activation(config))


def _config(artifact: Path) -> dict:
    try:
        value = json.loads((artifact / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise InputError(f"{artifact} has no readable config.json; pass an xformopt artifact") from None
    return value if isinstance(value, dict) else {}


def _activation(config: dict) -> torch.nn.Module:
    """The activation sentence-transformers saved with the model (torch's own classes only), else the
    sigmoid it applies to one-output models."""
    name = (config.get("sentence_transformers") or {}).get("activation_fn") or ""
    if name.rsplit(".", 1)[-1] == "Identity" and name.startswith("torch."):
        return torch.nn.Identity()
    return torch.nn.Sigmoid()
