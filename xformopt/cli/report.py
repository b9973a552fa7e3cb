"""`xformopt report DIR`: re-render an artifact's report from its report.json."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from xformopt.artifact import load_json
from xformopt.cli import options as opt
from xformopt.cli import output
from xformopt.errors import InputError

EXAMPLES = """
Examples:

    xformopt report xformopt-out/minilm                # the tables, as `optimize` printed them
    xformopt report out/ --markdown > comment.md       # paste into a pull request
    xformopt report out/ --json | jq '.stages[] | {name, speedup}'
"""


def load_report(directory: Path) -> tuple[dict, Path]:
    """DIR/report.json (DIR may also be the report.json itself), checked: (report, directory)."""
    from xformopt.report.build import REPORT_SCHEMA

    path = Path(directory)
    if not path.exists():
        raise InputError(f"{path} does not exist; pass the output directory of `xformopt optimize` (its -o)")
    if path.is_dir():
        path = path / "report.json"
    report = load_json(path, missing=f"{directory} has no report.json; run `xformopt optimize MODEL -o {directory}` to make one",
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
    directory: Annotated[Path, typer.Argument(metavar="DIR", help="The -o folder of `xformopt optimize` (report.json), or of a single-pass command (manifest.json).")],
    as_json: bool = typer.Option(False, "--json", help="Print report.json as one JSON document on stdout."),
    as_markdown: bool = typer.Option(False, "--markdown", help="Print the GitHub-flavoured Markdown (report.md) on stdout."),
    quiet: opt.Quiet = False,
) -> None:
    """Show the report of an artifact from DIR/report.json; re-write DIR/report.md and its plots.

    Prints the stage table (default), the JSON (--json) or the Markdown (--markdown). report.md,
    accuracy_latency.png and (with fixed-shape timings) latency_seq.png are re-drawn from the JSON
    with this version's renderer; report.json itself is never changed.
    """
    from xformopt.report.console import console_table
    from xformopt.report.markdown import markdown
    from xformopt.report.render import write_derived_files

    if as_json and as_markdown:
        raise InputError("--json and --markdown are exclusive; pick one")
    data, folder = load_report(directory)
    try:
        written = write_derived_files(data, folder, log=output.log)
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


def register(app: typer.Typer) -> None:
    app.command("report", help=(report.__doc__ or "") + EXAMPLES)(report)
