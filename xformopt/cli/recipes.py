"""`xformopt recipes list|show`: the shipped pass chains."""

from __future__ import annotations

import typer
from rich.syntax import Syntax
from rich.table import Table

from xformopt import recipe, targets
from xformopt.cli import options as opt
from xformopt.cli import output
from xformopt.errors import InputError
from xformopt.passes import get_pass

app = typer.Typer(help="List and show the shipped recipes.\n\nExample: xformopt recipes show default", no_args_is_help=True)


@app.command("list")
def list_recipes(as_json: opt.Json = False, quiet: opt.Quiet = False) -> None:
    """List the shipped recipes.

    Example: xformopt recipes list --json | jq -r '.[].name'
    """
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


def resolved_yaml(r, target_name: str | None) -> str:
    """The recipe with every option filled in, and what the target decides where an option is null
    (what it becomes at run time): each pass resolves its own options (``Pass.resolve``)."""
    import yaml

    asked = target_name or r.target
    target = targets.resolve(asked)
    data = r.to_dict()
    data["target"] = target.name
    data["passes"] = [{name: get_pass(name).resolve(options, target)}
                      for name, options in (next(iter(step.items())) for step in data["passes"])]
    origin = f"target {asked} resolves to {target.name} on this host" if asked == "auto" else f"target {target.name}"
    header = f"# resolved: {origin}; quantize formats as {target.name} decides them (weights {target.quant.weight_type})\n"
    return header + yaml.safe_dump(data, sort_keys=False)


@app.command("show")
def show(
    name: str = typer.Argument(..., metavar="RECIPE", help="A shipped recipe name or a YAML path."),
    resolved: bool = typer.Option(False, "--resolved", help="Show every option with its default filled in, and what the target decides."),
    target: str = typer.Option(None, "--target", "-t", help=f"With --resolved: resolve for this target instead of the recipe's ({opt.TARGETS})."),
    quiet: opt.Quiet = False,
) -> None:
    """Print a recipe's YAML (use it as a starting point for your own).

    Example: xformopt recipes show default > my-recipe.yaml
    """
    from pathlib import Path

    r = recipe.load(name)
    if target is not None and not resolved:
        raise InputError("--target applies to --resolved only; add --resolved")
    text = resolved_yaml(r, target) if resolved else \
        (Path(name) if Path(name).is_file() else recipe.RECIPES_DIR / f"{name}.yaml").read_text()
    if output.stdout.is_terminal:
        output.stdout.print(Syntax(text, "yaml"))
    else:
        output.stdout.out(text, end="", highlight=False)
