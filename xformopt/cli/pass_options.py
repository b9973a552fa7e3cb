"""A single-pass command's flags, derived from its pass's pydantic options model.

Every field of ``Pass.Options`` becomes ``--field-name`` with the field's default and its description
as help: ``Literal[...]`` as choices, ``bool`` as ``--x/--no-x`` (three states when the field may be
None: the target decides), int/float/str, a data option (``Pass.data_options``) as a FILE,
``list[int]``/``list[str]`` as a comma-separated value parsed back, and a union with ``str`` as text
the model parses (a mapping in such a union as ``key=value,...``). A field no flag can express (a bare
mapping) must be named in the command's ``left_out`` (the builder refuses otherwise), and the command's
help says it is set in a recipe.

A ``Spelling`` keeps a flag's established form where it differs (prune's ``--latency`` for
``measure_latency``, export's ``--exporter family`` for None). The command function is built with an
``inspect.Signature``: typer reads a function's ``__signature__`` and ``__annotations__``.

Hand-written: pydantic-typer (0.0.x) names flags ``--model.field`` and pydanclick decorates Click
commands, not typer's signature-built ones; neither keeps an established spelling per field.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

import typer
from pydantic import BaseModel
from pydantic.fields import FieldInfo

_EMPTY = inspect.Parameter.empty
_SCALARS = (bool, int, float, str)


@dataclass(frozen=True)
class Spelling:
    """A flag kept in its established form: its declarations, the value type and default the command
    line sees, and how that value maps back to the option (``to_option``)."""

    decls: tuple[str, ...] = ()
    type: Any = None
    default: Any = _EMPTY
    to_option: Callable[[Any], Any] | None = None
    option: dict = field(default_factory=dict)  # more typer.Option settings (metavar, callback, min/max)


@dataclass(frozen=True)
class Flag:
    """One option field as a command-line parameter; ``to_option`` turns the parsed value into the field's."""

    name: str
    parameter: inspect.Parameter
    to_option: Callable[[Any], Any]
    default: Any  # the model's default


class Unexpressible(TypeError):
    """A field whose type has no command-line form (a mapping, a nested model)."""


def model_default(info: FieldInfo) -> Any:
    return info.get_default(call_default_factory=True)


def help_for(info: FieldInfo) -> str:
    """The field's description, as written (it names choices like ``rtn`` that a capital would change)."""
    return (info.description or "").strip()


def _members(annotation) -> tuple[list, bool]:
    """(the types of a union, None left out; whether None was one of them)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = list(typing.get_args(annotation))
        return [a for a in args if a is not type(None)], type(None) in args
    return [annotation], False


def _split(value: str | None, item: type):
    """A comma-separated value as a list of ITEM (None: not given)."""
    if value is None:
        return None
    words = [w.strip() for w in value.split(",") if w.strip()]
    try:
        return [item(w) for w in words]
    except ValueError:
        example = "0,2" if item is int else "a,b"
        raise typer.BadParameter(f"expected comma-separated {item.__name__}s (e.g. {example}), got {value!r}") from None


def _list_item(annotation) -> type | None:
    """int or str for ``list[int]``/``list[str]``/``list[Literal[...]]``; None otherwise."""
    if typing.get_origin(annotation) is not list:
        return None
    (item,) = typing.get_args(annotation) or (None,)
    if typing.get_origin(item) is Literal and all(isinstance(v, str) for v in typing.get_args(item)):
        return str
    return item if item in (int, str) else None


def _cli_type(name: str, info: FieldInfo, data_options: tuple[str, ...]) -> tuple[Any, dict, Callable | None]:
    """(the type typer parses, extra typer.Option settings, a parser callback or None) for one field."""
    members, optional = _members(info.annotation)
    if len(members) > 1:  # e.g. float | str: the model's own validator parses the text
        if str in members and all(m in _SCALARS for m in members):
            return Optional[str], {}, None
        if str in members and all(m in _SCALARS or typing.get_origin(m) is dict for m in members):
            return Optional[str], {"metavar": "KEY=VALUE,..."}, lambda value: value  # the model parses the pairs
        raise Unexpressible(name)
    (kind,) = members
    if name in data_options:
        return Optional[Path], {"metavar": "FILE"}, None
    if (item := _list_item(kind)) is not None:
        metavar = "N,..." if item is int else "NAME,..."
        return Optional[str], {"metavar": metavar}, lambda value: _split(value, item)
    if kind in _SCALARS or typing.get_origin(kind) is Literal:
        return (Optional[kind] if optional else kind), {}, None
    raise Unexpressible(name)


def field_flag(name: str, info: FieldInfo, *, spelling: Spelling | None = None,
               data_options: tuple[str, ...] = ()) -> Flag:
    """The parameter for field NAME: ``--name`` (or its established spelling), the model's default, its help."""
    spelling = spelling or Spelling()
    default = model_default(info)
    cli_type, option, parse = _cli_type(name, info, data_options) if spelling.type is None else (spelling.type, {}, None)
    flag = "--" + name.replace("_", "-")
    decls = spelling.decls or ((f"{flag}/--no-{flag[2:]}",) if bool in _members(info.annotation)[0] else (flag,))
    cli_default = spelling.default
    if info.is_required():  # no default: a required option, always sent
        cli_default = _EMPTY
    elif cli_default is _EMPTY:
        cli_default = ",".join(map(str, default)) if parse and default else (None if parse else default)
    if parse is not None:
        option = {**option, "callback": parse}
    option = {**option, **spelling.option}
    annotation = Annotated[cli_type, typer.Option(*decls, help=help_for(info), **option)]
    parameter = inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=cli_default, annotation=annotation)
    if spelling.to_option is not None:
        to_option = spelling.to_option
    elif parse is not None:  # a list left empty on the command line is the model's default
        to_option = lambda value: default if value is None else value  # noqa: E731
    else:
        to_option = lambda value: value  # noqa: E731
    return Flag(name, parameter, to_option, default)


def model_flags(model: type[BaseModel], *, spellings: dict[str, Spelling] | None = None,
                left_out: dict[str, str] | None = None, data_options: tuple[str, ...] = ()) -> list[Flag]:
    """A flag for every field of MODEL except those LEFT_OUT (field -> why), in the model's order.

    Raises Unexpressible for a field with no command-line form that LEFT_OUT does not name, so a new
    option is a flag or a stated omission, never silently missing."""
    spellings, left_out = spellings or {}, left_out or {}
    unknown = (set(spellings) | set(left_out)) - set(model.model_fields)
    if unknown:
        raise ValueError(f"{model.__name__} has no field(s) {', '.join(sorted(unknown))}")
    return [field_flag(name, info, spelling=spellings.get(name), data_options=data_options)
            for name, info in model.model_fields.items() if name not in left_out]


def options_from(flags: list[Flag], values: dict) -> dict:
    """The pass options the command line set: each flag's value as the field takes it, defaults left out
    (the model fills them in, as for a recipe step that does not name them)."""
    options = {}
    for flag in flags:
        value = flag.to_option(values.pop(flag.name))
        if value != flag.default:
            options[flag.name] = str(value) if isinstance(value, Path) else value
    return options


def build_command(name: str, doc: str, parameters: list[inspect.Parameter], body: Callable[..., None]) -> Callable:
    """A function typer can register as command NAME: PARAMETERS as its signature, BODY(**values) its work."""
    seen = [p.name for p in parameters]
    if len(seen) != len(set(seen)):
        raise ValueError(f"{name}: a parameter named twice: {sorted(n for n in seen if seen.count(n) > 1)}")

    def command(**values) -> None:
        body(**values)

    command.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": None}
    command.__name__ = command.__qualname__ = name
    command.__doc__ = doc
    return command
