"""`xformopt passes list`: what each registered pass does, reads and may follow."""

from __future__ import annotations

import typer
from rich.table import Table

from xformopt.cli import options as opt
from xformopt.cli import output
from xformopt.passes import all_passes

app = typer.Typer(help="The registered passes.\n\nExample: xformopt passes list", no_args_is_help=True)


@app.command("list")
def list_passes(as_json: opt.Json = False, quiet: opt.Quiet = False) -> None:
    """List every pass with its stage, what it consumes and produces, what it needs, and its options.

    Example: xformopt passes list --json | jq -r '.[] | select(.stage == "onnx") | .name'
    """
    rows = [
        {
            "name": p.name,
            "stage": p.stage,
            "consumes": p.consumes,
            "produces": p.produces,
            "needs": list(p.needs),
            "must_not_follow": p.must_not_follow,
            "flags": {f"--{flag.replace('_', '-')}": option for flag, option in p.flags.items()},
            "data_options": list(p.data_options),
            "summary": p.summary,
            "options": sorted(p.Options.model_fields),
        }
        for p in all_passes()
    ]
    if as_json:
        output.emit_json(rows)
        return
    table = Table("Pass", "Stage", "In → out", "Needs", "What it does")
    for row in rows:
        table.add_row(row["name"], row["stage"], f"{row['consumes']} → {row['produces']}",
                      "\n".join(row["needs"]) or "-", row["summary"])
    output.stdout.print(table)
