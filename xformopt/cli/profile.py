"""`xformopt profile DIR`: where an artifact's time goes, from ONNX Runtime's profiler."""

from __future__ import annotations

import json
import shutil
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated

import typer

from xformopt.artifact import atomic_dir, check_output
from xformopt.benchmarking import measure
from xformopt.cli import options as opt
from xformopt.cli import output
from xformopt.measure.host import host_fingerprint, host_info
from xformopt.models import artifact_task
from xformopt.models.validate import check_threads
from xformopt.profiling import render
from xformopt.profiling.measure import Settings, add_peak, profile_stage
from xformopt.profiling.render import gemm_lines, headline
from xformopt.profiling.types import check_profile

EXAMPLES = """
Examples:

    xformopt profile out/                              # batch 1, real held-out lengths, 100 requests
    xformopt profile out/ -o prof/                     # + profile.json, profile.md, profile.png, trace.json
    xformopt profile out/ --batch 8 --seq 128 --json | jq '.shares'

The trace (prof/trace.json) opens in https://ui.perfetto.dev or chrome://tracing.
"""

OUTPUT_FILES = ("profile.json", "profile.md", "trace.json")


def profile(
    artifact: Annotated[Path, typer.Argument(metavar="DIR", help="The -o folder of `xformopt optimize`, or of a "
        "single-pass ONNX command (export, fuse, quantize).")],
    data: Path = typer.Option(None, "--data", metavar="FILE", help="Held-out CSV/TSV/JSONL/datasets dir [default: the data the artifact's report used]."),
    text_column: opt.TextColumn = None,
    text_pair_column: opt.TextPairColumn = None,
    batch: int = typer.Option(1, "--batch", min=1, max=4096, help="Texts per request."),
    seq: int = typer.Option(None, "--seq", min=2, max=8192, help="Every request exactly L tokens (real tokens, tiled) [default: each text's own length]."),
    runs: int = typer.Option(100, "--runs", min=3, max=100_000, help="Profiled requests (after the warm-up)."),
    warmup: int = typer.Option(10, "--warmup", min=0, max=10_000, help="Untimed requests first."),
    threads: opt.Threads = None,
    seed: int = typer.Option(None, "--seed", min=0, max=2**32 - 1, help="Which texts make the requests [default: the report's]."),
    out: Path = typer.Option(None, "--out", "-o", metavar="DIR", help="Write profile.json, profile.md, profile.png and ORT's trace.json here (atomically)."),
    remeasure_peak: bool = typer.Option(False, "--remeasure-peak", help="Measure this host's GEMM peak again (it is "
        "cached per host; one taken on a busy machine is low)."),
    force: opt.Force = False,
    as_json: opt.Json = False,
    quiet: opt.Quiet = False,
) -> None:
    """Profile an ONNX artifact with ONNX Runtime's profiler on real held-out texts.

    Shows the time of a request by operator type, category (GEMM, attention, layer norm, ...) and
    layer, tokenization's share, the GEMMs' achieved GFLOP/s against this host's measured peak
    (fp32 and int8, cached per host), and whether operators + tokenization add up to the
    end-to-end median (they must come within 10%).
    """

    if (task := artifact_task(artifact)) is not None:
        task.refuse("profile", f"{artifact} is a {task.name} artifact")
    protected = (artifact, data)
    if out is not None:
        check_output(out, force, protected)
    check_threads(threads)
    art = measure.load_artifact(artifact)
    run = measure.plan(art, measure.Overrides(data=data, text_column=text_column, text_pair_column=text_pair_column,
                                              seed=seed, threads=threads))
    texts, pairs = art.spec.task_def.timing_inputs(run.heldout)
    settings = Settings(batch=batch, seq=seq, runs=runs, warmup=warmup, threads=run.settings["threads"],
                        seed=run.settings["seed"])
    with tempfile.TemporaryDirectory(prefix="xformopt-profile-") as work:
        doc, trace = profile_stage(art.spec, art.path, texts, pairs, settings, Path(work))
        add_peak(doc, settings.threads, remeasure=remeasure_peak)
        info = host_info()
        doc = {"schema": doc.pop("schema"), "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
               "artifact": str(artifact), "stage": art.stage, "heldout": run.settings["heldout"], "host": info,
               "host_fingerprint": host_fingerprint(info), "trace": "trace.json" if out is not None else None, **doc}
        check_profile(doc)
        if out is not None:
            with atomic_dir(out, force, protected=protected) as tmp:
                shutil.copyfile(trace, tmp / "trace.json")
                (tmp / "profile.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
                images: tuple[str, ...] = ()
                try:
                    render.write_plot(doc, tmp / render.PLOT)
                    images = (render.PLOT,)
                except Exception as exc:  # noqa: BLE001 - matplotlib missing or broken: the numbers still count
                    output.log(f"{render.PLOT} not written: {type(exc).__name__}: {exc}")
                (tmp / "profile.md").write_text(render.markdown(doc, images), encoding="utf-8")
            output.log(f"wrote {out}/: {', '.join(OUTPUT_FILES + images)}")
    if as_json:
        output.emit_json(doc)
    else:
        print_human(doc)


def print_human(doc: dict) -> None:
    from rich.table import Table


    output.stdout.print(headline(doc), highlight=False, markup=False)
    table = Table(title="per request (mean)", show_header=True)
    for name in ("part", "ms", "share"):
        table.add_column(name, justify="left" if name == "part" else "right")
    for row in doc["breakdown"]:
        table.add_row(row["part"], f"{row['ms']:.3f}", f"{100 * row['share']:.1f}%")
    output.stdout.print(table)
    ops = Table(title="top operator types", show_header=True)
    for name in ("op type", "category", "ms", "share"):
        ops.add_column(name, justify="left" if name in ("op type", "category") else "right")
    for row in doc["op_types"][:10]:
        ops.add_row(row["op_type"], row["category"], f"{row['ms']:.3f}", f"{100 * row['share']:.1f}%")
    output.stdout.print(ops)
    layers = ", ".join(f"{r['layer']} {r['ms']:.2f}" for r in doc["layers"])
    output.stdout.print(f"by layer (ms): {layers}", highlight=False, markup=False)
    for line in gemm_lines(doc):
        output.stdout.print(line, highlight=False, markup=False)
    if not doc["accounted"]["within_limit"]:
        output.stdout.print(f"note: operators + tokenization are {100 * doc['accounted']['share_of_end_to_end_median']:.1f}% "
                            "of the end-to-end median, outside 10%: see 'ORT between kernels' and 'Python call and feed'",
                            highlight=False, markup=False)


def register(app: typer.Typer) -> None:
    app.command("profile", help=(profile.__doc__ or "") + EXAMPLES)(profile)
