"""How every xformopt command looks and fails: one Click command/group class and one usage-error line.

Typer draws a type column for every option (``<bool>`` for a flag, ``<path>``...) and writes the
usage line as ``{artifact}`` / ``[model]``; usage errors come as a 5-line box. These classes give
every command the same shape instead: flags show no type, arguments are upper-case names
(``MODEL``, ``DIR``), and a usage error is one ``error: ...`` line naming the help to read.
"""

from __future__ import annotations

import re

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


def _format_help(command, ctx, formatter) -> None:
    """Plain help for every command (xformopt.cli.help_text says why), never Typer's rich panels."""
    from xformopt.cli import help_text

    command.format_usage(ctx, formatter)
    if command.help:
        with formatter.indentation():
            help_text.write(formatter, command.help.partition("\f")[0])
    command.format_options(ctx, formatter)


def _format_options(command, ctx, formatter) -> None:
    """Arguments, then options, as name / description pairs; an argument shows no type (MODEL, not MODEL <str>)."""
    args, opts = [], []
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is None:
            continue
        if param.param_type_name == "argument":
            args.append((re.sub(r"\s+<[^>]*>$", "", record[0]), record[1]))
        else:
            opts.append(record)
    for title, rows in (("Arguments", args), ("Options", opts)):
        if rows:
            with formatter.section(title):
                formatter.write_dl(rows)


class Command(TyperCommand):
    def get_params(self, ctx):
        return _plain_flags(super().get_params(ctx), ctx)

    def format_help(self, ctx, formatter):
        _format_help(self, ctx, formatter)

    def format_options(self, ctx, formatter):
        _format_options(self, ctx, formatter)

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

    def format_help(self, ctx, formatter):
        _format_help(self, ctx, formatter)

    def format_options(self, ctx, formatter):
        _format_options(self, ctx, formatter)
        self.format_commands(ctx, formatter)


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
