"""Quantization-aware distillation: the fake-quantized Linear computes what ONNX Runtime's dynamic
INT8 MatMul computes, the QAT phase's record compares post-training INT8 and QAT on the same rows, the
saved student is a stock float model, bad QAT options exit 2."""

from __future__ import annotations

import json

import numpy as np
import pytest
from harden_helpers import assert_distill_refuses
from helpers import make_ctx, run_pass

from xformopt.passes.distill import qat as Q

FAST = dict(train_samples=96, eval_samples=32, max_length=32, batch_size=16, patience=0, checkpoint_every=0)


def _ort_dynamic_matmul(tmp_path, weight: np.ndarray, x: np.ndarray, per_channel: bool, reduce_range: bool):
    """x @ weight.T through ORT's dynamic quantization of a one-MatMul graph."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime import InferenceSession
    from onnxruntime.quantization import QuantType, quantize_dynamic

    w = numpy_helper.from_array(weight.T.copy().astype(np.float32), "W")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [x.shape[0], weight.shape[0]])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "f.onnx")
    quantize_dynamic(tmp_path / "f.onnx", tmp_path / "q.onnx", weight_type=QuantType.QInt8, per_channel=per_channel,
                     reduce_range=reduce_range)
    return InferenceSession(str(tmp_path / "q.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def _int8_reference(weight: np.ndarray, x: np.ndarray, per_channel: bool, reduce_range: bool) -> np.ndarray:
    """ORT's dynamic INT8 arithmetic in numpy, exact in 32 bits (what a kernel that never saturates computes):
    u8 activations from the tensor's own range (0 included), s8 symmetric weights, per channel or per tensor."""
    rmin, rmax = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
    scale = (rmax - rmin) / 255
    zero = np.clip(np.round(-rmin / scale), 0, 255)
    qx = np.clip(np.round(x / scale) + zero, 0, 255)
    bound = 64 if reduce_range else 127
    w_scale = (np.abs(weight).max(axis=1, keepdims=True) if per_channel else np.abs(weight).max()) / bound
    qw = np.clip(np.round(weight / w_scale), -bound, bound)
    return ((qx - zero) @ qw.T) * scale * np.reshape(w_scale, (1, -1))


@pytest.mark.real_host
@pytest.mark.parametrize("per_channel,reduce_range", [(True, False), (True, True), (False, False)])
def test_fake_quant_linear_matches_ort_dynamic_int8(tmp_path, per_channel, reduce_range):
    """The simulated INT8 is ORT's dynamic INT8 arithmetic: far closer to its exact 32-bit form than float is on
    every host, and to ORT's own INT8 MatMul wherever ORT's kernel computes that form (7-bit weights on every
    kernel; 8-bit weights where the u8 x s8 kernel does not saturate, i.e. with VNNI: the real probe decides)."""
    import torch

    from xformopt.measure import kernel_probe

    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 48, bias=False)
    with torch.no_grad():
        lin.weight[:8] *= 6.0  # channels of different ranges: per-channel scales matter
    model = torch.nn.Sequential(lin)
    x = (torch.randn(16, 64) * 2 + 0.5).float()
    with torch.no_grad():
        exact = model(x).numpy()
        assert Q.attach(model, per_channel=per_channel, reduce_range=reduce_range) == 1
        faked = model(x).numpy()
        assert Q.detach(model) == 1 and type(model[0]) is torch.nn.Linear
        assert np.array_equal(model(x).numpy(), exact)  # detach restores the float layer, same parameters
    reference = _int8_reference(lin.weight.detach().numpy().astype(np.float64), x.numpy().astype(np.float64),
                                per_channel, reduce_range)
    assert np.abs(reference - faked).max() < 0.1 * np.abs(reference - exact).max()
    if reduce_range or kernel_probe.int8_gemm_saturates() is False:
        ort = _ort_dynamic_matmul(tmp_path, lin.weight.detach().numpy(), x.numpy(), per_channel, reduce_range)
        err_fake = np.abs(ort - faked).max()
        err_float = np.abs(ort - exact).max()
        assert err_fake < 0.1 * err_float, (err_fake, err_float)


def test_qat_phase_record_and_float_student(tiny_classifier, sample_texts, tmp_path):
    """distill with qat: a second phase under fake quantization; its first evaluation is post-training INT8
    of the same student, its best is never below it on those rows; the saved student has plain Linears."""
    ctx = make_ctx(tiny_classifier, sample_texts, target="avx2")
    rec = run_pass("distill", ctx, tiny_classifier, tmp_path / "d", **FAST, label_column="", select="agreement",
                   max_steps=6, eval_every=3, qat=True, qat_epochs=0.5)
    qat = rec["qat"]
    assert qat["formats"]["weights"].endswith("[-64, 64] (reduce_range)")  # avx2: 7-bit weights, per channel
    assert "per channel" in qat["formats"]["weights"] and qat["linear_layers"] > 0
    assert qat["evaluations"][0]["step"] == 0 and qat["steps"] >= 1
    assert qat["qat_on_eval_rows"]["agreement"] >= qat["ptq_on_eval_rows"]["agreement"]  # any host: the best of evaluations that include the PTQ one
    assert "float_after_qat_on_eval_rows" in qat
    from safetensors import safe_open

    with safe_open(tmp_path / "d" / "model.safetensors", "pt") as f:
        assert not any("fake_quant" in k for k in f.keys())
    assert json.loads((tmp_path / "d" / "config.json").read_text())["num_hidden_layers"] == 1


def test_bad_new_options_exit_2(tiny_classifier, tmp_path, capsys):
    """QAT, unlabelled-text and relation options: one line, exit 2, nothing written, before any training."""
    cases = [
        (["--qat", "--qat-epochs", "0"], "qat_epochs"),
        (["--unlabeled-data", tmp_path / "missing.txt"], "data file not found"),
        (["--augment", "99"], "augment"),
        (["--relation-weight", "-1"], "relation_weight"),
    ]
    assert_distill_refuses(tiny_classifier, cases, tmp_path, capsys)
