"""The error types every command maps to an exit code (docs/api.md; docs/reference/exit-codes.md is
generated from this module and xformopt/signals.py when the docs are built).

0 ok · 1 a gate failed · 2 bad input or usage · 3 a pass failed. The Python API (``xformopt.optimize``,
``run_pass``, ``bench``, ...) raises the same classes, so ``except xformopt.XformoptError`` catches all
of them and ``except xformopt.InputError`` only what the caller must fix before trying again.
"""

from __future__ import annotations


class XformoptError(Exception):
    """Base class: carries the exit code the CLI returns and a one-line message."""

    exit_code = 3

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class InputError(XformoptError):
    """Bad input or usage: a missing path, a wrong column, a broken recipe, ... (exit 2)."""

    exit_code = 2


class GateFailed(XformoptError):
    """A regression gate, an accuracy budget or an agreement floor was not met (exit 1). ``accept``:
    option values that would accept what was written (the CLI prints the command with them)."""

    exit_code = 1

    def __init__(self, message: str, accept: dict | None = None):
        super().__init__(message)
        self.accept = dict(accept or {})


class BudgetMissed(GateFailed):
    """A pass wrote its best effort but missed its accuracy budget or agreement floor (exit 1): unlike a
    bad input, the artifact exists; ``result`` is what was written (``xformopt.Result`` from ``optimize``,
    the pass entry from ``run_pass``), so the caller can inspect it or keep it anyway; ``accept``: the
    option values that would accept it."""

    def __init__(self, message: str, result=None, accept: dict | None = None):
        super().__init__(message, accept)
        self.result = result


class PassFailed(XformoptError):
    """A pass ran but could not produce a verified result (exit 3)."""

    exit_code = 3
