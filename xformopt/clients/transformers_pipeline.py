"""An ONNX artifact as the ``model`` of a transformers ``pipeline``.

optimum's ``ORTModelFor...`` classes did this, but optimum-onnx pins transformers below 5 and cannot be
installed beside it; a pipeline needs only ``config``, ``device``, ``dtype`` and a ``forward`` that
returns a ModelOutput, which this class gives over an ONNX Runtime session (hand-written for that
reason, ~40 lines)::

    from transformers import AutoTokenizer, pipeline
    from xformopt.clients.transformers_pipeline import OnnxPipelineModel

    model = OnnxPipelineModel("out")
    classify = pipeline("text-classification", model=model, tokenizer=AutoTokenizer.from_pretrained("out"))
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers import AutoConfig
from transformers.modeling_outputs import ModelOutput

from xformopt.errors import InputError
from xformopt.models import artifact_task
from xformopt.runtime.session import ort_feed, ort_session
from xformopt.tasks import get as task_named


class OnnxPipelineModel(torch.nn.Module):
    """The artifact's ``model.onnx`` behind the interface transformers' pipelines call; its outputs
    named as the task exports them (``logits``, ``start_logits``/``end_logits``, ``last_hidden_state``)."""

    def __init__(self, artifact: str | Path, task: str | None = None, threads: int | None = None):
        super().__init__()
        artifact = Path(artifact)
        self.config = AutoConfig.from_pretrained(artifact)
        self.session = ort_session(artifact / "model.onnx", threads)
        self.input_names = [i.name for i in self.session.get_inputs()]
        chosen = task_named(task) if task else artifact_task(artifact)
        if chosen is None:
            raise InputError(f"{artifact} has no config.json of a model type transformers knows; pass an xformopt artifact")
        self.output_names = list(chosen.export_outputs)

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32

    def can_generate(self) -> bool:
        return False

    def forward(self, **inputs) -> ModelOutput:
        encoded = {name: np.asarray(value) for name, value in inputs.items() if value is not None}
        outputs = self.session.run(None, ort_feed(encoded, self.input_names))
        return ModelOutput(**{name: torch.from_numpy(out) for name, out in zip(self.output_names, outputs)})

