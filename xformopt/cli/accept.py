"""The command that accepts what a failed gate wrote (an agreement floor missed, ...): the user's own
command line with the accepting option values set, printed after the failure line."""

from __future__ import annotations

import shlex


def accept_command(argv: list[str], accept: dict) -> str:
    """``argv`` (the arguments after ``xformopt``) with each of ``accept`` set as its flag (replacing a
    value the user gave) and ``--force``: the output directory now exists, and the rerun replaces it."""
    args = list(argv)
    for name, value in accept.items():
        flag = "--" + name.replace("_", "-")
        args = _without(args, flag) + [flag, str(value)]
    if "--force" not in args:
        args.append("--force")
    return shlex.join(["xformopt", *args])


def _without(args: list[str], flag: str) -> list[str]:
    """``args`` less ``flag VALUE`` and ``flag=VALUE``."""
    kept, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg == flag:
            skip = True
        elif not arg.startswith(flag + "="):
            kept.append(arg)
    return kept
