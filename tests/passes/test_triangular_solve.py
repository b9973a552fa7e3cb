"""Linear attention's triangular solve as one ONNX Loop (xformopt/passes/export/triangular_solve.py): the Loop
solves what torch solves, the modelling code's export switch is turned off only while exporting and only in
modules that use it for the solve, and an export the Loop cannot write falls back to the unrolled form.

The end-to-end check (a tiny Qwen3.5 exported with the Loops, parity with PyTorch) is in
tests/decoder/test_decoder_families.py."""

from __future__ import annotations

import contextlib
import logging

import numpy as np
import pytest
import tiny_decoders
from helpers import make_ctx, run_pass

from xformopt.passes.export import triangular_solve


def _reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    import torch

    return torch.linalg.solve_triangular(torch.tensor(a), torch.tensor(b), upper=False, unitriangular=True).numpy()


@pytest.mark.parametrize("kind", ["random", "repeated-keys"])
def test_the_loop_solves_what_torch_solves(kind):
    rng = np.random.default_rng(0)
    n = 64
    if kind == "random":
        below = rng.normal(0, 0.3, (2, 3, n, n))
    else:  # one token repeated: every pair of keys alike, the hardest case for a closed form
        below = np.full((2, 3, n, n), 0.9) + rng.normal(0, 0.01, (2, 3, n, n))
    a = (np.tril(below, -1) + np.eye(n)).astype(np.float32)
    a += np.triu(rng.normal(0, 1, (n, n)), 1).astype(np.float32)  # above the diagonal: never read
    b = rng.normal(0, 1, (2, 3, n, 16)).astype(np.float32)
    got = np.asarray(triangular_solve.solve_unit_lower(a, b))
    want = _reference(np.tril(a, -1) + np.eye(n, dtype=np.float32), b)
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-4 * max(1.0, np.abs(want).max())


@pytest.mark.parametrize("form", [dict(upper=True, unitriangular=True), dict(upper=False, unitriangular=False),
                                  dict(upper=False, left=False, unitriangular=True)])
def test_other_solves_are_not_written_as_the_loop(form):
    with pytest.raises(NotImplementedError):
        triangular_solve._translate(None, None, **form)


def test_the_switch_is_off_only_while_exporting_and_only_where_the_solve_uses_it(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    qwen = AutoModelForCausalLM.from_pretrained(tiny_decoders.build(tmp_path / "q", "qwen3_5_text", seed=1))
    modules = triangular_solve._solving_modules(qwen)
    assert [m.__name__ for m in modules] == ["transformers.models.qwen3_5.modeling_qwen3_5"]
    switch = getattr(modules[0], triangular_solve.EXPORT_SWITCH)
    with pytest.raises(RuntimeError), triangular_solve.loop_solves(qwen) as table:
        assert getattr(modules[0], triangular_solve.EXPORT_SWITCH)() is False
        assert list(table) == [torch.ops.aten.linalg_solve_triangular.default]
        raise RuntimeError("the export failed")
    assert getattr(modules[0], triangular_solve.EXPORT_SWITCH) is switch  # restored, even after a failure

    with triangular_solve.loop_solves(torch.nn.Sequential(torch.nn.Linear(2, 2))) as table:  # no linear attention
        assert table == {}


def test_an_export_the_loop_cannot_write_falls_back_to_the_unrolled_form(tmp_path, sample_texts, monkeypatch,
                                                                          caplog):
    """A translation that fails (here: forced on the embedding, which every decoder has) leaves the modelling
    code's own export form, loudly; the pass's parity check holds."""
    import torch

    from xformopt.passes.export import decoder, decoder_dynamo

    def refuse(*args, **kwargs):
        raise NotImplementedError("not this one")

    @contextlib.contextmanager
    def failing(model):
        yield {torch.ops.aten.embedding.default: refuse}

    monkeypatch.setattr(decoder_dynamo, "loop_solves", failing)
    monkeypatch.setattr(decoder, "GQA_EXPORTER", decoder.DYNAMO_EXPORTER)  # Granite's route: the plain dynamo export
    model = tiny_decoders.build(tmp_path / "m", "granite", seed=1)
    with caplog.at_level(logging.WARNING):
        record = run_pass("export", make_ctx(model, sample_texts), model, tmp_path / "e")
    assert "Loops" not in record["exporter"] and "decoder_dynamo" in record["exporter"]
    assert record["parity"]["max_abs_diff"] < 1e-4 and record["parity"]["greedy_argmax_mismatches"] == 0
    assert any("could not be written as a Loop" in r.getMessage() for r in caplog.records)
