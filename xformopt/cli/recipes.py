"""`xformopt recipes list|show`: the shipped pass chains."""

from __future__ import annotations

import typer
from rich.syntax import Syntax
from rich.table import Table

from xformopt import recipe, targets
from xformopt.cli import options as opt, output
from xformopt.errors import InputError
from xformopt.passes.quantize import QuantizeOptions, resolved_formats

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
    """The recipe with every option filled in, and the quantize formats the target decides (what
    `null` would become at run time), read from the target profile through quantize.resolved_formats."""
    from types import SimpleNamespace

    import yaml

    asked = target_name or r.target
    target = targets.resolve(asked)
    data = r.to_dict()
    data["target"] = target.name
    for step in data["passes"]:
        (pass_name, options), = step.items()
        if pass_name != "quantize" or options.get("mode") == "int4":  # int4 reads none of the INT8 formats
            continue
        # resolved_formats reads only ctx.target: no model is needed to say what the target decides
        formats = resolved_formats(SimpleNamespace(target=target), QuantizeOptions.model_validate(options))
        options.update({"weight_type": formats["weight_type"], "per_channel": formats["per_channel"],
                        "reduce_range": formats["reduce_range"], "op_types": formats["op_types"], "quant_format": formats["format"],
                        "activation_type": formats["activation_type"],
                        "activation_symmetric": formats["activation_symmetric"]})
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
