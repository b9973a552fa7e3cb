"""Measure an artifact as ``xformopt optimize`` measured it: same rows, same settings, timed alone.

The bench document (schema ``xformopt.bench/1``) has these top-level keys, always all of them::

    schema            "xformopt.bench/1"
    created           ISO-8601 UTC time of the measurement
    artifact_path     the artifact directory as given on the command line
    model             {source, model_type, task} (from the artifact's report)
    target            hardware profile the artifact was built for
    headline_metric   "accuracy" (classification) or "cosine_to_baseline" (embeddings)
    settings          {mode "real", batch 1, threads, rounds, warmup, repeats, seed,
                       heldout {source, rows, row_ids_sha256}, thread_pools}
    host              measure.host.host_info() of the machine that ran the bench
    host_fingerprint  measure.host.host_fingerprint(host)
    artifact          {stage, latency: <modes.solo_repeats dict>, metrics}: the same shape as
                      report.json's "artifact", so either document can be the next --baseline
    notes             list of strings: what was skipped or assumed (e.g. baseline-relative metrics
                      skipped because --data selects other rows)
    comparison        see gate.compare: {baseline, baseline_schema, baseline_created, gated,
                      comparable, settings_mismatch, host_mismatch, host_mismatch_allowed, reason,
                      limits, checks: [{name, kind, unit, baseline, current, change,
                      change_pct | change_points, limit, tolerance, threshold, verdict, message,
                      evidence, limit_relative (only with a relative budget such as "1%": limit is
                      then that share of the baseline's points)}], passed}. Without --baseline it compares against the artifact's
                      own report.json with gated=false (informative, never fails the command).

A field is never renamed or removed within a schema version.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from xformopt import models, progress
from xformopt.artifact import MANIFEST_SCHEMA, load_json, read_manifest
from xformopt.benchmarking.gate import check_document, heldout_identity
from xformopt.errors import InputError
from xformopt.measure import host as host_facts
from xformopt.measure import modes
from xformopt.measure.host import host_fingerprint, host_info
from xformopt.models.validate import check_onnx_file
from xformopt.recipe import EvaluationSettings
from xformopt.report.schema import BENCH_SCHEMA, REPORT_SCHEMA
from xformopt.report.types import Report
from xformopt.runtime.encoder import OrtPredictor
from xformopt.runtime.session import thread_pool_setting
from xformopt.seq2seq import GRAPH_FILES as SEQ2SEQ_GRAPHS

_log = logging.getLogger(__name__)


TOP_LEVEL_KEYS = ("schema", "created", "artifact_path", "model", "target", "headline_metric", "settings",
                  "host", "host_fingerprint", "artifact", "notes", "comparison")


@dataclass
class Artifact:
    """A checked artifact directory: its manifest, report, recipe evaluation settings and model spec.

    ``report`` is None for the output of single-pass commands (export, fuse, quantize chained in a
    shell): their manifest records the passes but no recipe, no report and no baseline stages; they
    are measured with the default evaluation settings, and what needs a baseline is said missing."""

    path: Path
    manifest: dict
    report: Report | None
    evaluation: object  # recipe.EvaluationSettings
    spec: object  # models.ModelSpec

    @property
    def stage(self) -> str:
        if self.report is not None:
            return self.report["artifact"].get("stage")
        return self.manifest["passes"][-1].get("pass", "?")

    @property
    def model(self) -> dict:
        if self.report is not None:
            return self.report.get("model")
        source = self.manifest.get("input") or {}
        return {k: source.get(k) for k in ("source", "model_type", "task")}

    @property
    def target(self) -> str | None:
        if self.report is not None:
            return self.report.get("target")
        return (self.manifest.get("target") or {}).get("name")

    @property
    def headline_metric(self) -> str:
        return self.report.get("headline_metric") if self.report is not None else self.spec.task_def.headline


NO_REPORT_NOTE = ("no report.json (the output of single-pass commands): no baseline stages to compare with, so no "
                  "speed-up over PyTorch and no metric relative to the fp32 baseline; run `xformopt optimize` for "
                  "those, or gate with --baseline")


@dataclass
class Overrides:
    """Command-line choices; None means "as the artifact's report/recipe did"."""

    data: Path | None = None
    text_column: str | None = None
    text_pair_column: str | None = None
    label_column: str | None = None
    limit: int | None = None
    seed: int | None = None
    threads: int | None = None
    rounds: int | None = None
    warmup: int | None = None
    repeats: int | None = None


@dataclass
class Plan:
    """What will be measured: settings as they go into the bench document, and the held-out rows."""

    settings: dict
    heldout: object  # data.TextDataset
    notes: list[str] = field(default_factory=list)


def _read_json(path: Path, what: str) -> dict:
    return load_json(path, missing=f"{path.parent} has no {what}; pass the -o folder of `xformopt optimize`",
                     fix="re-run optimize")


def load_artifact(path: Path) -> Artifact:
    """Check the artifact's files (manifest, report, model.onnx, config, tokenizer) without loading the model."""
    from pydantic import ValidationError

    path = Path(path)
    if not path.exists():
        raise InputError(f"artifact not found: {path}; pass the -o folder of `xformopt optimize`")
    if not path.is_dir():
        raise InputError(f"{path} is a file; pass the artifact directory (the -o folder of `xformopt optimize`)")
    manifest = read_manifest(path)
    if not isinstance(manifest, dict) or manifest.get("schema") != MANIFEST_SCHEMA:
        got = manifest.get("schema") if isinstance(manifest, dict) else None
        raise InputError(f"{path / 'manifest.json'} has schema {got!r}, expected {MANIFEST_SCHEMA!r}; re-run optimize")
    recipe = manifest.get("recipe")
    passes = manifest.get("passes")
    if recipe is None and isinstance(passes, list) and passes and all(isinstance(p, dict) for p in passes):
        return _load_chain(path, manifest)
    if not isinstance(recipe, dict) or not isinstance(recipe.get("evaluation"), dict):
        raise InputError(f"{path / 'manifest.json'} records neither a recipe nor a pass list; re-run the command that made it")
    try:
        evaluation = EvaluationSettings.model_validate(recipe["evaluation"])
    except ValidationError as exc:
        err = exc.errors()[0]
        raise InputError(f"{path / 'manifest.json'}: recipe.evaluation.{'.'.join(map(str, err['loc']))}: {err['msg']}") from None
    report = _read_json(path / "report.json", "report.json")
    if report.get("schema") != REPORT_SCHEMA:
        raise InputError(f"{path / 'report.json'} has schema {report.get('schema')!r}, expected {REPORT_SCHEMA!r}; re-run optimize")
    check_document(report, str(path / "report.json"))  # settings, host and the artifact's latency
    if not isinstance(report.get("model"), dict):
        raise InputError(f"{path / 'report.json'} lacks its 'model' section; re-run optimize")
    task = (manifest.get("input") or {}).get("task") or report["model"].get("task")
    check_graphs(path, models.artifact_task(path))
    spec = models.describe(path, task)
    if not (path / "tokenizer.json").is_file():
        raise InputError(f"{path} has no tokenizer.json; the artifact is incomplete, re-run optimize")
    return Artifact(path, manifest, report, evaluation, spec)


# Task.graph -> the ONNX files bench times (encoder-decoders: two graphs, xformopt/seq2seq)
GRAPH_FILES = {"encoder": ("model.onnx",), "seq2seq": SEQ2SEQ_GRAPHS}


def check_graphs(path: Path, task) -> None:
    """The artifact's ONNX graphs are there and readable, else one line (exit 2)."""
    names = GRAPH_FILES.get(task.graph if task is not None else "encoder", GRAPH_FILES["encoder"])
    missing = [n for n in names if not (path / n).is_file()]
    if missing:
        raise InputError(f"{path} has no {' or '.join(missing)}; bench times the ONNX artifact of `xformopt optimize`")
    for name in names:
        check_onnx_file(path / name)


def _load_chain(path: Path, manifest: dict) -> Artifact:
    """The output of `xformopt export|fuse|quantize`: measured with the default evaluation settings."""
    last = manifest["passes"][-1].get("pass")
    task = models.artifact_task(path)
    graphs = GRAPH_FILES.get(task.graph if task is not None else "encoder", GRAPH_FILES["encoder"])
    if not all((path / name).is_file() for name in graphs):
        raise InputError(f"{path} is the output of `xformopt {last}` (a PyTorch folder, no {' or '.join(graphs)}); bench times "
                         f"ONNX: run `xformopt export {path} -o NEW_DIR` and bench NEW_DIR")
    if not (path / "tokenizer.json").is_file():
        raise InputError(f"{path} has no tokenizer.json; the stage is incomplete, re-run `xformopt {last}`")
    spec = models.describe(path, (manifest.get("input") or {}).get("task"))
    return Artifact(path, manifest, None, EvaluationSettings(), spec)


def row_ids_digest(row_ids) -> str:
    return hashlib.sha256(json.dumps([int(i) for i in row_ids]).encode()).hexdigest()[:16]


def plan(artifact: Artifact, opts: Overrides) -> Plan:
    """Settings and held-out rows: the flags where given, else what the artifact's report used."""
    ev = artifact.evaluation
    reported = artifact.report["settings"] if artifact.report is not None else {}
    notes: list[str] = [] if artifact.report is not None else [NO_REPORT_NOTE]
    recipe_data = Path(ev.data) if ev.data else artifact.spec.task_def.default_data("test")
    if opts.data is None and not Path(str(recipe_data).split("::")[0]).exists():
        raise InputError(f"the artifact was evaluated on {ev.data}, which is not found from here; "
                         "pass --data PATH to the same file")
    data_path = Path(opts.data) if opts.data is not None else recipe_data
    if opts.data is None or _same_path(data_path, recipe_data):
        # The recipe's data: its column choices are the defaults, so the same rows come back.
        columns = tuple(flag if flag is not None else default for flag, default in
                        ((opts.text_column, ev.text_column), (opts.text_pair_column, ev.text_pair_column),
                         (opts.label_column, ev.label_column)))
    else:
        columns = (opts.text_column, opts.text_pair_column, opts.label_column)
    seed = opts.seed if opts.seed is not None else reported.get("seed", ev.seed)
    limit = opts.limit if opts.limit is not None else ev.limit
    heldout = artifact.spec.task_def.load(
        data_path, label2id=artifact.spec.label2id or None, limit=limit, seed=seed,
        columns={"text": columns[0], "text_pair": columns[1], "label": columns[2]})
    usable = host_facts.usable_cpus()
    threads = opts.threads or reported.get("threads") or ev.threads or usable
    if threads != usable:
        _log.info(f"note: timing with {threads} threads ({'--threads' if opts.threads else 'as the report did'}), "
            f"but this process may use {usable} CPUs")
        notes.append(f"{threads} threads, {usable} CPUs usable by this process")
    settings = {
        "mode": "real",
        "batch": 1,
        "threads": int(threads),
        "rounds": int(opts.rounds or reported.get("rounds") or ev.latency_rounds),
        "warmup": int(opts.warmup if opts.warmup is not None else reported.get("warmup", ev.warmup)),
        "repeats": int(opts.repeats or reported.get("repeats") or ev.repeats),
        "seed": int(seed),
        "heldout": {"source": heldout.source, "rows": len(heldout), "row_ids_sha256": row_ids_digest(heldout.row_ids)},
        "thread_pools": thread_pool_setting(),
    }
    return Plan(settings, heldout, notes)


def _same_path(a: Path, b: Path) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return False


def load_reference(artifact: Artifact):
    """The fp32 baseline's outputs on the held-out rows and their rows.json, or None when absent."""
    import numpy as np

    ref = artifact.path / "reference"
    outputs_path, rows_path = ref / "baseline_outputs.npy", ref / "rows.json"
    if not outputs_path.is_file() or not rows_path.is_file():
        return None
    rows = _read_json(rows_path, "reference/rows.json")
    try:
        outputs = np.load(outputs_path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise InputError(f"{outputs_path} is not a readable .npy file ({exc}); re-run optimize") from None
    if not isinstance(rows.get("row_ids"), list) or len(rows["row_ids"]) != len(outputs):
        raise InputError(f"{rows_path} does not describe {outputs_path.name} ({len(outputs)} rows); re-run optimize")
    return outputs, rows


def open_predictor(artifact: Artifact, threads: int):
    """The artifact's ONNX Runtime predictor; a damaged model or tokenizer is bad input (exit 2)."""
    try:
        return OrtPredictor(artifact.spec, artifact.path, threads=threads)
    except InputError:
        raise
    except Exception as exc:  # onnxruntime / tokenizers raise their own types for damaged files
        reason = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise InputError(f"cannot load the artifact {artifact.path} ({type(exc).__name__}: {reason}); re-run optimize") from None


def reference_for(artifact: Artifact, heldout):
    """(the fp32 baseline's outputs, None) when reference/ holds outputs for exactly these held-out rows,
    else (None, why not)."""
    reference = load_reference(artifact)
    if reference is None:
        return None, ("the artifact has no reference/ (fp32 baseline outputs)" if artifact.report is not None else
                      "single-pass commands record no fp32 baseline outputs (reference/); `xformopt optimize` does")
    ref_outputs, rows = reference
    same_rows = (
        [int(i) for i in rows["row_ids"]] == [int(i) for i in heldout.row_ids]
        and heldout_identity({"source": rows.get("source", "")})["source"] == heldout_identity({"source": heldout.source})["source"]
    )
    return (ref_outputs, None) if same_rows else (None, "the held-out rows differ from the rows of reference/rows.json")


def metrics_for(artifact: Artifact, heldout, outputs, seed: int, notes: list[str]):
    """Metrics as optimize computed them for the artifact (the task's score) when the held-out rows
    are the reference rows; otherwise label metrics only (no fp32 baseline outputs for other rows)."""
    import numpy as np

    task = artifact.spec.task_def
    ref_outputs, reason = reference_for(artifact, heldout)
    if ref_outputs is not None and ref_outputs.shape[1:] != np.asarray(outputs).shape[1:]:
        raise InputError(f"{artifact.path / 'reference'} holds outputs of shape {ref_outputs.shape[1:]}, the model gives "
                         f"{np.asarray(outputs).shape[1:]}; the artifact is inconsistent, re-run optimize")
    if ref_outputs is not None:
        return task.score(outputs, ref_outputs, heldout, seed)
    note = f"{task.skipped_without_baseline()} skipped: {reason}"
    _log.info(f"note: {note}")
    notes.append(note)
    return task.score(outputs, None, heldout, seed)  # the metrics against labels alone


def measure(artifact: Artifact, run: Plan) -> dict:
    """Score and time the artifact; returns the bench document without its ``comparison``."""
    s, heldout = run.settings, run.heldout
    notes = list(run.notes)
    predictor = open_predictor(artifact, s["threads"])
    _log.info(f"evaluating {artifact.path} on {len(heldout)} held-out rows")
    outputs = predictor.predict_data(heldout, progress=progress.tracker("evaluating the artifact (rows)"))
    metrics = metrics_for(artifact, heldout, outputs, s["seed"], notes)
    _log.info(f"timing the artifact alone ({s['repeats']} repeats x {s['rounds']} rounds, {s['threads']} threads)")
    # Exactly as evaluate.run.evaluate_stages times report["artifact"].
    texts, pairs = artifact.spec.task_def.timing_inputs(heldout)
    latency = modes.solo_repeats(predictor, texts, pairs, rounds=s["rounds"],
                                 warmup=s["warmup"], repeats=s["repeats"], seed=s["seed"],
                                 progress=progress.tracker(f"latency (alone, {s['repeats']} repeats)"))
    return document(artifact, s, {"stage": artifact.stage, "latency": latency, "metrics": metrics}, notes)


def document(artifact: Artifact, settings: dict, measured: dict, notes: list[str]) -> dict:
    """The bench document without its ``comparison``: ``measured`` is its ``artifact`` section."""
    host = host_info()
    return {
        "schema": BENCH_SCHEMA,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "artifact_path": str(artifact.path),
        "model": artifact.model,
        "target": artifact.target,
        "headline_metric": artifact.headline_metric,
        "settings": settings,
        "host": host,
        "host_fingerprint": host_fingerprint(host),
        "artifact": measured,
        "notes": notes,
    }


def preview(artifact: Artifact, run: Plan) -> dict:
    """The parts of the bench document known before timing (for comparability checks up front)."""
    host = host_info()
    return {"schema": BENCH_SCHEMA, "settings": run.settings, "host": host, "host_fingerprint": host_fingerprint(host),
            "headline_metric": artifact.headline_metric}
