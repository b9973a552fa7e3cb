"""Where trials run: ``local`` (a process pool sized to the cores, or sequential) or ``ray``.

An executor takes TrialJobs and hands back results as they finish; it knows nothing of Optuna.
"""

from __future__ import annotations

from typing import Protocol


class Executor(Protocol):
    kind: str
    address: str | None
    workers: int

    def submit(self, job) -> object: ...

    def wait(self, handles: list) -> list[tuple[object, dict]]:
        """Block until at least one handle is done; return (handle, result) for every finished one."""
        ...

    def close(self, abort: bool = False) -> None: ...


def describe(executor) -> dict:
    return {"kind": executor.kind, "address": executor.address, "workers": executor.workers}
