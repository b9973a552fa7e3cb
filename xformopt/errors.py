"""The error types every command maps to an exit code (documented in the README).

0 ok · 1 a gate failed · 2 bad input or usage · 3 a pass failed.
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


class PassFailed(XformoptError):
    """A pass ran but could not produce a verified result (exit 3)."""

    exit_code = 3
