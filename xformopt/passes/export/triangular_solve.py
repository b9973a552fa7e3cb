"""Linear attention's triangular solve, written for ONNX as one Loop.

A Gated DeltaNet layer (Qwen3.5's linear attention) solves two unit lower-triangular systems per chunk of 64
tokens. ONNX has no triangular solve, so transformers' modelling code, when it sees an export, unrolls
forward substitution into 63 sliced steps per solve: a graph several times larger, slower to export and to
run (docs/results/llms.md). Here the layer keeps ``torch.linalg.solve_triangular``, and the exporter turns
that op into one ONNX Loop doing the same forward substitution, one row per step.

Hand-written because no library provides it: onnxscript's torch library leaves ``aten_linalg_solve_triangular``
unimplemented, and neither ONNX nor ONNX Runtime's contrib ops have a triangular solve.
The export pass's parity check against PyTorch still covers every graph this writes.
"""

from __future__ import annotations

import contextlib
import inspect
import sys

import onnxscript
from onnxscript import FLOAT
from onnxscript import opset18 as op

# The modelling code's switch to its unrolled export form (transformers.utils.import_utils).
EXPORT_SWITCH = "is_torchdynamo_exporting"
SOLVING_FUNCTIONS = ("torch_chunk_gated_delta_rule",)


@onnxscript.script(default_opset=op)
def solve_unit_lower(A: FLOAT, B: FLOAT) -> FLOAT:
    """X with A @ X = B, for A unit lower-triangular in its last two axes: forward substitution, a row per step
    (row i of X is B's row i less the rows above it, weighted by A's row i below its diagonal)."""
    n = op.Squeeze(op.Shape(A, start=-1))
    below = op.Trilu(A, op.Constant(value_int=-1), upper=0)
    rows = op.Unsqueeze(op.Range(op.Constant(value_int=0), n, op.Constant(value_int=1)), op.Constant(value_ints=[-1]))
    X = op.Mul(B, 0.0)
    for i in range(n):
        at = op.Reshape(i, op.Constant(value_ints=[1]))
        row = op.Sub(op.Gather(B, at, axis=-2), op.MatMul(op.Gather(below, at, axis=-2), X))
        X = op.Add(X, op.Mul(op.Cast(op.Equal(rows, i), to=1), row))
    return X


def _translate(A, B, upper: bool, left: bool = True, unitriangular: bool = False):
    """``aten.linalg_solve_triangular`` as the Loop above, for the form linear attention uses."""
    if upper or not left or not unitriangular:
        raise NotImplementedError("only a unit lower-triangular solve from the left is written as a Loop")
    return solve_unit_lower(A, B)


def _solving_modules(model) -> list:
    """The modelling modules of ``model`` whose linear attention switches to the unrolled form on export (the
    switch used by the solving function alone, so turning it off changes nothing else)."""
    found = []
    for name in {type(m).__module__ for m in model.modules()}:
        module = sys.modules.get(name)
        if module is None or not hasattr(module, EXPORT_SWITCH):
            continue
        if not any(hasattr(module, f) for f in SOLVING_FUNCTIONS):
            continue
        try:
            source = inspect.getsource(module)
        except (OSError, TypeError):
            continue
        if source.count(f"{EXPORT_SWITCH}()") == 1:
            found.append(module)
    return found


@contextlib.contextmanager
def loop_solves(model):
    """While exporting ``model``: its linear-attention layers keep ``solve_triangular``, and the translation
    table (for ``torch.onnx.export(custom_translation_table=)``) writes that op as a Loop. Yields an empty
    table when the model has no such layer."""
    import torch

    modules = _solving_modules(model)
    saved = [(module, getattr(module, EXPORT_SWITCH)) for module in modules]
    try:
        for module, _ in saved:
            setattr(module, EXPORT_SWITCH, lambda: False)
        yield {torch.ops.aten.linalg_solve_triangular.default: _translate} if modules else {}
    finally:
        for module, switch in saved:
            setattr(module, EXPORT_SWITCH, switch)
