"""Trials on a Ray cluster: one Ray task per trial with its CPUs declared, retried on a lost worker.

Ray, not a home-made scheduler: it places each task where its CPUs are free, and re-runs a task
whose worker process or node died (``max_retries``). Trials write their artifacts straight into
the search directory, which must therefore be on a path every node sees (see docs/search.md); the
driver checks each artifact arrived and says so when it did not.
"""

from __future__ import annotations

from xformopt.errors import InputError
from xformopt.recipe_search.trial import run_trial

RETRIES = 3


def require_ray():
    try:
        import ray
    except ImportError:
        raise InputError("--ray needs Ray, an optional extra: pip install 'xformopt[ray]'") from None
    return ray


class RayExecutor:
    kind = "ray"

    def __init__(self, address: str, cpus_per_trial: int, workers: int | None = None, runtime_env: dict | None = None):
        ray = require_ray()
        self._ray = ray
        try:
            ray.init(address=address, ignore_reinit_error=True, log_to_driver=False, runtime_env=runtime_env)
        except ConnectionError as exc:
            raise InputError(f"--ray {address}: no Ray cluster there ({exc}); start one with `ray start --head` "
                             "or pass its address (host:port), or `auto`") from None
        self.address = address
        total = int(ray.cluster_resources().get("CPU", 0))
        if total < cpus_per_trial:
            raise InputError(f"--ray {address}: the cluster has {total} CPUs, a trial declares {cpus_per_trial} "
                             "(--cpus-per-trial); lower it or add nodes")
        self.workers = workers or max(1, total // cpus_per_trial)
        # retry_exceptions=False: a trial that fails on its own returns a failed result; only a lost
        # worker or node (a system failure) is retried.
        self._task = ray.remote(num_cpus=cpus_per_trial, max_retries=RETRIES, retry_exceptions=False)(run_trial)
        self._running: set = set()

    def submit(self, job):
        ref = self._task.remote(job.to_dict())
        self._running.add(ref)
        return ref

    def wait(self, handles):
        ready, _ = self._ray.wait(list(handles), num_returns=1)
        results = []
        for ref in ready:
            self._running.discard(ref)
            try:
                results.append((ref, self._ray.get(ref)))
            except Exception as exc:  # retries exhausted (WorkerCrashedError, NodeDiedError, ...)
                results.append((ref, {"status": "failed", "error": f"lost after {RETRIES} retries: {type(exc).__name__}"}))
        return results

    def close(self, abort: bool = False):
        if abort:  # interrupted: stop the trials in flight on the cluster, not only the driver
            for ref in self._running:
                self._ray.cancel(ref, force=True)
        self._ray.shutdown()
