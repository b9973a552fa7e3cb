"""`xformopt recipes list|show`: the shipped pass chains."""

from __future__ import annotations

import typer
from rich.syntax import Syntax
from rich.table import Table

from xformopt.cli import output

app = typer.Typer(help="List and show the shipped recipes.\n\nExample: xformopt recipes show default", no_args_is_help=True)


@app.command("list")
def list_recipes(as_json: bool = typer.Option(False, "--json", help="One JSON document on stdout.")) -> None:
    """List the shipped recipes.

    Example: xformopt recipes list --json | jq -r '.[].name'
    """
    from xformopt import recipe

    rows = []
    for name in recipe.shipped_names():
        r = recipe.load(name)
        rows.append({"name": name, "description": r.description, "passes": [s.name for s in r.passes]})
    if as_json:
        output.emit_json(rows)
        return
    table = Table("Recipe", "Passes", "Description")
    for row in rows:
        table.add_row(row["name"], " -> ".join(row["passes"]), row["description"])
    output.stdout.print(table)


@app.command("show")
def show(
    name: str = typer.Argument(..., help="A shipped recipe name or a YAML path."),
    resolved: bool = typer.Option(False, "--resolved", help="Show every option with its default filled in."),
) -> None:
    """Print a recipe's YAML (use it as a starting point for your own).

    Example: xformopt recipes show default > my-recipe.yaml
    """
    from pathlib import Path

    from xformopt import recipe

    r = recipe.load(name)
    text = r.to_yaml() if resolved else (Path(name) if Path(name).is_file() else recipe.RECIPES_DIR / f"{name}.yaml").read_text()
    if output.stdout.is_terminal:
        output.stdout.print(Syntax(text, "yaml"))
    else:
        output.stdout.out(text, end="", highlight=False)
