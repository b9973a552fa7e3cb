"""How every xformopt command looks and fails: one Click command/group class and one usage-error line.

Typer draws a type column for every option (``<bool>`` for a flag, ``<path>``...) and writes the
usage line as ``{artifact}`` / ``[model]``; usage errors come as a 5-line box. These classes give
every command the same shape instead: flags show no type, arguments are upper-case names
(``MODEL``, ``DIR``), and a usage error is one ``error: ...`` line naming the help to read.
"""

from __future__ import annotations

import typer
from typer.core import TyperCommand, TyperGroup

# Click's UsageError: typer >= 0.22 vendors Click (typer._click), older typer uses click itself;
# BadParameter is re-exported by both and derives from it.
UsageError = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


# Option values are named in upper case like DIR/FILE/POINTS|PCT, not Typer's <str>/<int>.
_TYPE_METAVARS = {"str": "TEXT", "int": "N", "float": "NUMBER", "path": "PATH"}


def _plain_flags(params: list, ctx) -> list:
    for param in params:
        if param.param_type_name != "option" or param.metavar is not None:
            continue
        if getattr(param, "is_flag", False):
            param.metavar = ""  # a flag takes no value: show none (Typer would show <bool>)
            continue
        shown = (param.display_type_rich(ctx=ctx) or "").strip("<>")  # "str", "int range", "fastest|all"
        kind = shown.split()[0] if shown else ""
        param.metavar = shown if "|" in shown else _TYPE_METAVARS.get(kind, kind.upper() or None)
    return params


class Command(TyperCommand):
    def get_params(self, ctx):
        return _plain_flags(super().get_params(ctx), ctx)

    def collect_usage_pieces(self, ctx):
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if param.param_type_name == "argument":
                name = param.metavar or param.name.upper()
                pieces.append(name if param.required else f"[{name}]")
        return pieces


class Group(TyperGroup):
    def get_params(self, ctx):
        return _plain_flags(super().get_params(ctx), ctx)


def apply(app: typer.Typer) -> None:
    """Give every registered command and sub-group of APP (recursively) the classes above."""
    app.info.cls = Group
    for info in app.registered_commands:
        info.cls = Command
    for group in app.registered_groups:
        group.cls = Group
        apply(group.typer_instance)


def usage_line(exc, root, argv: list[str]) -> str:
    """Click's usage error as one line: the problem, then which command's help to read."""
    message = " ".join(exc.format_message().split()).rstrip(".").replace("Value error, ", "")
    if getattr(exc, "ctx", None) is not None:
        path = exc.ctx.command_path
    else:  # parser errors (an option missing its value) carry no context: find the command in ARGV
        names, command = ["xformopt"], root
        for token in argv:
            sub = getattr(command, "commands", {}).get(token)
            if sub is not None:
                names.append(token)
                command = sub
        path = " ".join(names)
    return f"{message}; see `{path} --help`"
