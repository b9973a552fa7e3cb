"""An ONNX artifact inside sentence-transformers: its first module (the transformer) run by ONNX Runtime,
the model's own Pooling / Normalize / Dense modules after it, so ``encode`` returns what the original
``SentenceTransformer`` returned, at the artifact's speed.

sentence-transformers' own ``backend="onnx"`` needs optimum-onnx, which pins transformers below 5 and so
cannot be installed beside sentence-transformers 6; this module is the route that works today::

    from xformopt.clients.sentence_transformers_module import onnx_sentence_transformer

    model = onnx_sentence_transformer("out")     # a SentenceTransformer
    vectors = model.encode(["a text", "another"])
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.base.modules import InputModule

from xformopt.errors import InputError
from xformopt.runtime.predictor import load_predictor

TRANSFORMER_TYPES = ("sentence_transformers.models.Transformer", "sentence_transformers.base.modules.Transformer",
                     "sentence_transformers.base.modules.transformer.Transformer")


class OnnxTransformer(InputModule):
    """The token-embedding step of a sentence-transformers pipeline over the artifact's model.onnx."""

    config_keys = ["max_seq_length"]

    def __init__(self, artifact: str | Path, max_seq_length: int | None = None, threads: int | None = None,
                 int8_scales: str = "per-token"):
        super().__init__()
        self.artifact = Path(artifact)
        # The runner xformopt.load() uses: a dynamic-INT8 graph quantizes each token's activations with
        # its own scale (int8_scales="per-token"), so a text's vector does not depend on its batch mates.
        self.runner = load_predictor(self.artifact, threads=threads, int8_scales=int8_scales).runner
        self.tokenizer = self.runner.tokenizer
        self.max_seq_length = max_seq_length or self.tokenizer.model_max_length

    def preprocess(self, inputs: Sequence[Any], prompt: str | None = None, **kwargs) -> dict[str, torch.Tensor]:
        texts = [prompt + text for text in inputs] if prompt else list(inputs)
        return dict(self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_seq_length,
                                   return_tensors="pt"))

    def forward(self, features: dict[str, Any], **kwargs) -> dict[str, Any]:
        encoded = {name: np.asarray(value) for name, value in features.items() if isinstance(value, torch.Tensor)}
        features["token_embeddings"] = torch.from_numpy(self.runner.raw_outputs(encoded))
        return features

    def get_sentence_embedding_dimension(self) -> int:
        return int(self.runner.session.get_outputs()[0].shape[-1])

    def save(self, output_path: str, *args, **kwargs) -> None:
        raise NotImplementedError("an ONNX sentence-transformers pipeline is saved as the xformopt artifact itself")


def onnx_sentence_transformer(artifact: str | Path, threads: int | None = None,
                              int8_scales: str = "per-token") -> SentenceTransformer:
    """A ``SentenceTransformer`` whose transformer is the artifact's ONNX graph and whose other modules
    are the ones the artifact carries (modules.json and its folders, copied from the model at export)."""
    artifact = Path(artifact)
    try:
        modules = json.loads((artifact / "modules.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise InputError(f"{artifact} has no readable modules.json: it was not exported from a sentence-transformers "
                         "model; load it with xformopt.load() instead") from None
    built: list[torch.nn.Module] = []
    for entry in modules:
        kind = entry.get("type", "")
        if kind in TRANSFORMER_TYPES or kind.endswith(".Transformer"):
            built.append(OnnxTransformer(artifact, _max_length(artifact), threads, int8_scales))
        else:
            built.append(_load_module(kind, artifact, entry.get("path", "")))
    return SentenceTransformer(modules=built, device="cpu")


def _max_length(artifact: Path) -> int | None:
    try:
        return json.loads((artifact / "sentence_bert_config.json").read_text(encoding="utf-8")).get("max_seq_length")
    except (OSError, ValueError):
        return None


def _load_module(kind: str, artifact: Path, subfolder: str) -> torch.nn.Module:
    """A sentence-transformers module class by its saved type name, loaded from its folder; only the
    library's own classes (no code named by a file is imported)."""
    import importlib

    module_name, _, class_name = kind.rpartition(".")
    if not module_name.startswith("sentence_transformers."):
        raise InputError(f"{artifact / 'modules.json'} names {kind!r}, which is not a sentence-transformers module")
    cls = getattr(importlib.import_module(module_name), class_name)
    return cls.load(str(artifact), subfolder=subfolder) if subfolder else cls.load(str(artifact))
