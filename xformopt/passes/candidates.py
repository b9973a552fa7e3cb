"""Export, fuse and time candidate graphs: the one helper for a pass that chooses among models by
their measured speed (prune's plans, and its pruned-vs-unpruned check).

Each candidate becomes a fully fused fp32 ONNX graph in a temporary folder (removed on exit), and
all of them are timed together, interleaved at batch 1 (``passes.timing``, ``measure.modes``), so
their medians compare under the same load. Two ways in: ``add_model`` exports an in-memory torch
model with xformopt's exporter (no parity check: fast, for many candidates), ``add_checkpoint`` runs a saved
checkpoint through xformopt's own export and fuse passes (parity checked, as a run would).
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import warnings
from pathlib import Path

from xformopt import models
from xformopt.measure.modes import real
from xformopt.models.quiet import quiet_loggers
from xformopt.passes.export.dynamo import export_encoder
from xformopt.passes.export.run import DYNAMO_MIN_OPSET, ExportOptions, ExportPass
from xformopt.passes.fuse.run import FuseOptions, FusePass, build_fused
from xformopt.passes.timing import time_stage_dirs
from xformopt.runtime.encoder import OrtPredictor


class CandidateGraphs:
    """Fused ONNX candidates in one temporary folder: ``with CandidateGraphs(ctx, "prefix-") as c: ...``."""

    def __init__(self, ctx, prefix: str):
        self.ctx = ctx
        self.prefix = prefix
        self.dirs: dict[str, Path] = {}

    def __enter__(self) -> CandidateGraphs:
        self._tmp = tempfile.TemporaryDirectory(prefix=self.prefix)
        self.work = Path(self._tmp.name)
        return self

    def __exit__(self, *exc) -> None:
        self._tmp.cleanup()

    def add_model(self, key: str, model, *, pruned: bool = False, spec=None) -> dict[str, int]:
        """Export ``model`` (in memory, no parity check) and fuse it with every fusion; returns the
        fused-op counts. ``spec``: the model's own when it is not the context's family (a pretrained student)."""
        ctx = self.ctx if spec is None else dataclasses.replace(self.ctx, spec=spec)
        stage, raw = self.work / key, self.work / f"{key}-export"
        stage.mkdir()
        raw.mkdir()
        # A pruned graph's attention widths differ per layer: ORT reads them from the graph (see fuse).
        sub = dataclasses.replace(ctx, spec=dataclasses.replace(ctx.spec, pruned=True)) if pruned else ctx
        with warnings.catch_warnings(), quiet_loggers("transformers", "torch.onnx", "torch.export", "onnxscript",
                                                       "onnxruntime.transformers", "fusion_attention"):
            warnings.simplefilter("ignore")
            export_encoder(model.eval(), ctx.spec.task_def, raw / "model.onnx", DYNAMO_MIN_OPSET,
                           ctx.spec.family.export_route())
            counts = build_fused(raw / "model.onnx", stage / "model.onnx", sub, ())
        shutil.rmtree(raw)
        self.dirs[key] = stage
        return counts

    def add_checkpoint(self, key: str, src: Path) -> dict:
        """Run the checkpoint ``src`` through xformopt's export and fuse (select=all) passes; returns the
        fuse record."""
        ctx = self.ctx
        sub = dataclasses.replace(ctx, spec=models.stage_spec(ctx.spec, src), quiet=True)
        exported, fused = self.work / f"{key}-export", self.work / f"{key}-fused"
        exported.mkdir()
        fused.mkdir()
        # ORT warns that a pruned layer's Q width differs from the input width; that is the point here.
        with quiet_loggers("onnxruntime.transformers", "fusion_attention"):
            ExportPass().run(sub, src, exported, ExportOptions())
            record = FusePass().run(sub, exported, fused, FuseOptions(select="all"))
        self.dirs[key] = fused
        return record

    def time_encoded(self, rounds: int, tokenizer_dir: Path | None = None,
                     tokenizer_dirs: dict[str, Path] | None = None) -> dict[str, dict]:
        """Every candidate interleaved on pre-tokenized real texts (:func:`passes.timing.time_stage_dirs`)."""
        return time_stage_dirs(self.ctx, self.dirs, rounds, tokenizer_dir=tokenizer_dir, tokenizer_dirs=tokenizer_dirs)

    def time_real(self, texts: list[str], rounds: int, pairs: list[str] | None = None) -> dict:
        """Every candidate interleaved on ``texts`` (and their ``pairs``), tokenization included
        (:func:`measure.modes.real`)."""
        ctx = self.ctx
        predictors = {name: OrtPredictor(ctx.spec, d, threads=ctx.threads) for name, d in self.dirs.items()}
        return real(predictors, texts, pairs, rounds=rounds, warmup=10, seed=0)
