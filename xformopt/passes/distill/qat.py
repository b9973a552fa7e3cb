"""Quantization-aware training: the student's Linear layers see the INT8 arithmetic ONNX Runtime's
dynamic quantization will run, so the last distillation epoch(s) learn weights that survive it.

What is simulated (the formats of ``quantize`` with ``mode: dynamic``, xformopt/passes/quantize/run.py):

- weights: signed 8-bit, symmetric, one scale per output channel (``per_channel``) or per tensor, range
  [-127, 127], or [-64, 64] with ``reduce_range`` (the 7-bit weights of targets without VNNI); the scale is
  max|w| / 127 (/ 64), as ORT's quantizer computes it from the final weights;
- activations: unsigned 8-bit, asymmetric, per tensor, the range taken from the tensor itself on every
  call (ORT's ``DynamicQuantizeLinear``: min and max with 0 included, scale = (max - min) / 255).

The fake quantization is torch's own (``torch.ao.quantization.FakeQuantize``, straight-through
gradients): a moving-average observer with ``averaging_constant=1`` is exactly "this tensor's range"
(dynamic activations, and weights' ranges as they are now, not their history). ``torch.ao.nn.qat.Linear``
fakes the weight; the module here adds the input's fake quantization in the same forward (the eager
QAT flow would put it in a separate observer module, which changes the module tree that
``save_pretrained`` writes). ``detach`` puts plain ``nn.Linear`` modules back with the trained parameters:
the saved student is a stock float model; ``quantize`` then writes the INT8 graph.

Every ``nn.Linear`` is wrapped (attention, FFN, pooler, classifier): ORT's dynamic quantization takes
every MatMul/Gemm with a constant weight. Embeddings and layer norms stay float, as in the INT8 graph.
"""

from __future__ import annotations

import logging

_log = logging.getLogger(__name__)


def qconfig(per_channel: bool, reduce_range: bool):
    import torch
    from torch.ao.quantization import (
        FakeQuantize,
        MovingAverageMinMaxObserver,
        MovingAveragePerChannelMinMaxObserver,
        QConfig,
    )

    bound = 64 if reduce_range else 127
    if per_channel:
        weight = FakeQuantize.with_args(observer=MovingAveragePerChannelMinMaxObserver, averaging_constant=1.0,
                                        quant_min=-bound, quant_max=bound, dtype=torch.qint8,
                                        qscheme=torch.per_channel_symmetric, ch_axis=0)
    else:
        weight = FakeQuantize.with_args(observer=MovingAverageMinMaxObserver, averaging_constant=1.0,
                                        quant_min=-bound, quant_max=bound, dtype=torch.qint8,
                                        qscheme=torch.per_tensor_symmetric)
    activation = FakeQuantize.with_args(observer=MovingAverageMinMaxObserver, averaging_constant=1.0,
                                        quant_min=0, quant_max=255, dtype=torch.quint8,
                                        qscheme=torch.per_tensor_affine)
    return QConfig(activation=activation, weight=weight)


def _linear_class():
    import torch.nn.functional as F
    from torch.ao.nn.qat import Linear as QatLinear

    class FakeQuantLinear(QatLinear):
        """torch's QAT Linear (fake-quantized weight) with the input fake-quantized too."""

        def __init__(self, linear, config):
            super().__init__(linear.in_features, linear.out_features, linear.bias is not None, qconfig=config,
                             device=linear.weight.device, dtype=linear.weight.dtype)
            self.weight = linear.weight  # the same Parameters: the optimizer and the saved model see them
            self.bias = linear.bias
            self.input_fake_quant = config.activation()

        def forward(self, x):
            return F.linear(self.input_fake_quant(x), self.weight_fake_quant(self.weight), self.bias)

    return FakeQuantLinear


def attach(model, *, per_channel: bool, reduce_range: bool) -> int:
    """Wrap every ``nn.Linear`` of ``model`` in place; returns how many were wrapped."""
    import torch

    config = qconfig(per_channel, reduce_range)
    cls = _linear_class()
    targets = [(name, module) for name, module in model.named_modules()
               if type(module) is torch.nn.Linear]
    for name, module in targets:
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, attr, cls(module, config))
    return len(targets)


def detach(model) -> int:
    """Plain ``nn.Linear`` modules back in place of the wrapped ones (same trained parameters)."""
    import torch

    cls_name = "FakeQuantLinear"
    wrapped = [(name, module) for name, module in model.named_modules() if type(module).__name__ == cls_name]
    for name, module in wrapped:
        linear = torch.nn.Linear(module.in_features, module.out_features, bias=module.bias is not None,
                                 device=module.weight.device, dtype=module.weight.dtype)
        linear.weight = module.weight
        linear.bias = module.bias
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, attr, linear)
    return len(wrapped)


def budget_share(epochs: float, qat_epochs: float) -> float:
    """The part of a time budget the QAT phase is planned to take: its epochs' share, a fifth more for the
    fake-quantization work, at most half."""
    return min(0.5, 1.2 * qat_epochs / (epochs + qat_epochs))


def run_phase(*, trainer_cls, trainer_kwargs: dict, settings, qat_epochs: float, lr: float, per_channel: bool,
              reduce_range: bool, max_seconds: float | None) -> dict:
    """The last epoch(s) with fake quantization: a second training run of the (already distilled)
    student, same data, teacher outputs and loss, learning rate ``lr`` decaying linearly to 0, held-out
    evaluation under fake quantization; its step 0 is post-training INT8 of the same student (so the
    record compares the two on the same rows, and with keep: best the kept checkpoint is never worse than PTQ there).
    Not resumable: an interrupted QAT phase starts over (the distilled student before it is kept)."""
    import dataclasses

    student = trainer_kwargs["student"]
    wrapped = attach(student, per_channel=per_channel, reduce_range=reduce_range)
    phase = dataclasses.replace(settings, lr=lr, warmup=0.0, epochs=qat_epochs, max_steps=None,
                                max_seconds=max_seconds, patience=0, stop_at=None, checkpoint_every=0)
    _log.info(f"distill: quantization-aware phase: {qat_epochs:g} epoch(s), {wrapped} Linear layers fake-quantized "
        f"(INT8 weights {'per channel' if per_channel else 'per tensor'}{', 7-bit' if reduce_range else ''}, "
        "dynamic u8 activations)")
    trainer = trainer_cls(**{**trainer_kwargs, "settings": phase, "resume": False,
                             "identity": trainer_kwargs["identity"] + ":qat",
                             "checkpoint_root": trainer_kwargs["checkpoint_root"] / "qat"})
    try:
        result = trainer.run()
    finally:
        detach(student)
    after_float = trainer.evaluate()
    return {
        "epochs": qat_epochs, "lr": lr, "linear_layers": wrapped,
        "formats": {"weights": "int8 symmetric " + ("per channel" if per_channel else "per tensor")
                    + (" [-64, 64] (reduce_range)" if reduce_range else " [-127, 127]"),
                    "activations": "uint8 asymmetric per tensor, dynamic (range of each tensor)"},
        "ptq_on_eval_rows": {k: v for k, v in result.before.items() if k not in ("best_so_far",)},
        "qat_on_eval_rows": {k: v for k, v in result.kept.items() if k not in ("best_so_far",)},
        "float_after_qat_on_eval_rows": after_float,
        "steps": result.steps, "best_step": result.best_step, "kept_step": result.kept_step,
        "stopped_because": result.stopped_because,
        "seconds": result.seconds, "evaluations": result.history,
    }
