"""`xformopt report DIR`: re-render an artifact's report from its report.json."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from xformopt.artifact import load_json, read_manifest
from xformopt.cli import options as opt
from xformopt.cli import output
from xformopt.errors import InputError
from xformopt.passes.record import PassRecord
from xformopt.report.console import console_table
from xformopt.report.markdown import markdown
from xformopt.report.render import write_derived_files
from xformopt.report.schema import REPORT_SCHEMA
from xformopt.report.types import Report

EXAMPLES = """
Examples:

    xformopt report xformopt-out/minilm                # the tables, as `optimize` printed them
    xformopt report out/ --markdown > comment.md       # paste into a pull request
    xformopt report out/ --json | jq '.stages[] | {name, speedup}'
"""


def load_report(directory: Path) -> tuple[Report, Path]:
    """DIR/report.json (DIR may also be the report.json itself), checked: (report, directory)."""
    path = Path(directory)
    if not path.exists():
        raise InputError(f"{path} does not exist; pass the output directory of `xformopt optimize` (its -o)")
    if path.is_dir():
        path = path / "report.json"
    report = load_json(path, missing=f"{directory} has no report.json or manifest.json; pass the -o folder of an xformopt "
                       "command, or make one with `xformopt optimize MODEL -o NEW_DIR`",
                       fix="re-run `xformopt optimize` to rewrite it")
    schema = report.get("schema")
    if schema != REPORT_SCHEMA:
        raise InputError(
            f"{path} has schema {schema!r}, this xformopt reads {REPORT_SCHEMA!r}; "
            "re-run `xformopt optimize` or use the xformopt version that wrote it"
        )
    stages = report.get("stages")
    if not isinstance(stages, list) or not stages or not all(isinstance(s, dict) and "name" in s for s in stages) \
            or "headline_metric" not in report:
        raise InputError(f"{path} is an incomplete {REPORT_SCHEMA} report (no stages or headline_metric); re-run `xformopt optimize`")
    return report, path.parent


def report(
    directory: Annotated[Path, typer.Argument(metavar="DIR", help="The -o folder of `xformopt optimize` "
        "(report.json), or of a single-pass command (manifest.json).")],
    as_json: bool = typer.Option(False, "--json", help="Print report.json as one JSON document on stdout."),
    as_markdown: bool = typer.Option(False, "--markdown", help="Print the GitHub-flavoured Markdown (report.md) on stdout."),
    quiet: opt.Quiet = False,
) -> None:
    """Show the report of an artifact from DIR/report.json; re-write DIR/report.md and its plots.

    Prints the stage table (default), the JSON (--json) or the Markdown (--markdown). report.md,
    accuracy_latency.png and (with fixed-shape timings) latency_seq.png are re-drawn from the JSON
    with this version's renderer; report.json itself is never changed.
    """
    if as_json and as_markdown:
        raise InputError("--json and --markdown are exclusive; pick one")
    directory = Path(directory)
    if directory.is_dir() and not (directory / "report.json").exists() and (directory / "manifest.json").is_file():
        return chain_report(directory, as_json, as_markdown)
    data, folder = load_report(directory)
    try:
        written = write_derived_files(data, folder)
        output.log("re-wrote " + ", ".join(str(p) for p in written))
    except OSError as exc:  # a read-only artifact still prints
        output.log(f"could not re-write report.md/plots in {folder} ({type(exc).__name__}: {exc.strerror or exc})")
        written = []
    if as_json:
        output.emit_json(data)
    elif as_markdown:
        images = [p.name for p in written if p.suffix == ".png"]
        sys.stdout.write(markdown(data, images=images))
        sys.stdout.flush()
    else:
        output.stdout.print(console_table(data))


# --------------------------------------------------------------------------- single-pass outputs


def chain_rows(manifest: dict) -> list[dict]:
    """One row per pass the manifest records: what it did (the pass command's own summary line)."""
    rows = []
    for entry in manifest.get("passes") or []:
        if not isinstance(entry, dict) or not isinstance(entry.get("record"), dict):
            raise InputError("manifest.json: a pass entry has no record; re-run the command that wrote it")
        try:
            text = PassRecord.from_dict(entry).summary()  # the pass command's own line
        except (KeyError, TypeError, IndexError, ValueError):  # a record of another xformopt version
            text = "(record not readable by this version; see manifest.json)"
        peak = (entry.get("memory") or {}).get("peak_rss_mb")
        rows.append({"pass": entry.get("pass", "?"), "seconds": entry.get("seconds"),
                     "peak_mb": "-" if peak is None else f"{peak:,.0f}", "summary": text})
    return rows


def chain_report(directory: Path, as_json: bool, as_markdown: bool) -> None:
    """The output of single-pass commands has a manifest (model, target, versions, every pass's
    record) but no report: render that, and say what needs `xformopt optimize` or `xformopt bench`."""
    from rich.table import Table

    manifest = read_manifest(directory)
    if not isinstance(manifest, dict) or not manifest.get("passes"):
        raise InputError(f"{directory / 'manifest.json'} records no passes; pass the -o folder of an xformopt command")
    rows = chain_rows(manifest)
    source = manifest.get("input") or {}
    target = (manifest.get("target") or {}).get("name", "?")
    title = f"{directory}: {source.get('source')} ({source.get('model_type')}, {source.get('task')}) -> {target}"
    missing = (f"no accuracy or latency per stage: this folder was made by single-pass commands; "
               f"`xformopt bench {directory}` measures it, `xformopt optimize` reports every stage against PyTorch")
    output.log("note: " + missing)
    if as_json:
        output.emit_json(manifest)
        return
    if as_markdown:
        lines = [f"## {title}", "", "| Pass | Seconds | Peak RSS (MB) | What it did |", "|---|---:|---:|---|"]
        lines += [f"| {r['pass']} | {r['seconds'] if r['seconds'] is not None else '-'} | {r['peak_mb']} | "
                  f"{r['summary'].replace('|', chr(92) + '|')} |" for r in rows]
        sys.stdout.write("\n".join([*lines, "", f"_{missing}_", ""]))
        sys.stdout.flush()
        return
    table = Table("Pass", "Seconds", "Peak MB", "What it did", title=title)
    for r in rows:
        table.add_row(r["pass"], "-" if r["seconds"] is None else f"{r['seconds']:.1f}", r["peak_mb"], r["summary"])
    output.stdout.print(table)


def register(app: typer.Typer) -> None:
    app.command("report", help=(report.__doc__ or "") + EXAMPLES)(report)
