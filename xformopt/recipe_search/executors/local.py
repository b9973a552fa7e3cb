"""Trials on this machine: sequential in-process (one worker), or a process pool sized to the cores."""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing

from xformopt.recipe_search.trial import run_trial


class SequentialExecutor:
    kind = "local"
    address = None
    workers = 1

    def __init__(self):
        self._done: dict[int, dict] = {}

    def submit(self, job):
        handle = len(self._done)
        self._done[handle] = run_trial(job)
        return handle

    def wait(self, handles):
        return [(h, self._done.pop(h)) for h in handles]

    def close(self, abort: bool = False):
        pass


class PoolExecutor:
    """One process per running trial: torch and ONNX Runtime keep per-process thread pools, and a
    crashed trial must not take the search down. ``spawn``, because forking a process that has
    loaded torch's OpenMP runtime can deadlock."""

    kind = "local"
    address = None

    def __init__(self, workers: int):
        self.workers = workers
        self._pool = cf.ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))

    def submit(self, job):
        return self._pool.submit(run_trial, job.to_dict())

    def wait(self, handles):
        done, _ = cf.wait(handles, return_when=cf.FIRST_COMPLETED)
        results = []
        for future in done:
            try:
                results.append((future, future.result()))
            except Exception as exc:  # the worker process died (killed, out of memory)
                results.append((future, {"status": "failed", "error": f"worker lost: {type(exc).__name__}: {exc}"}))
        return results

    def close(self, abort: bool = False):
        """Wait for the pool to drain; ``abort`` (the search was interrupted or failed) ends the running
        trials now instead of minutes later. A trial cut off this way is rerun by --resume."""
        if not abort:
            self._pool.shutdown(wait=True, cancel_futures=True)
            return
        # No public way to stop a ProcessPoolExecutor's workers before Python 3.14's terminate_workers().
        processes = list((getattr(self._pool, "_processes", None) or {}).values())
        manager = getattr(self._pool, "_executor_manager_thread", None)
        self._pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.terminate()
        # The pool's manager thread reaps its workers too, and only one waiter gets a child's exit status: a
        # join of ours that loses that race sees the process as still alive. Waiting for the manager first
        # leaves every worker reaped through the same Process objects.
        if manager is not None:
            manager.join(timeout=30)
        for process in processes:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join(timeout=5)


def make(workers: int):
    return SequentialExecutor() if workers <= 1 else PoolExecutor(workers)
