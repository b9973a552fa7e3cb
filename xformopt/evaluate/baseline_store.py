"""The PyTorch baseline's outputs on the held-out rows, kept on disk (``baseline-outputs/`` in the xformopt cache,
:mod:`xformopt.cache_stores`), so a run that scores the same model on the same rows reads them instead of running
the model again: every trial of a shape search, a second recipe on the same model. On a base-size model the
baseline's pass over the 2,014 vendored test rows takes 1-1.5 minutes on 2 cores, once per trial before this.

The key is everything the outputs depend on: the model folder's content hash, the task, the texts and pairs in
order, the predictor's maximum length, the thread count (it changes float sums' order) and the library versions.
Rows with per-task payloads (``TextDataset.extra``: words and tags, answer spans) are not kept: their outputs are
not one numeric array. The file is a plain ``.npy`` read with ``allow_pickle=False``, written to a temporary
sibling and renamed into place; a file that does not load as one array of as many rows is recomputed.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np

from xformopt.artifact import hash_dir
from xformopt.atomic import replacing
from xformopt.cache_stores import store, touch
from xformopt.measure.host import library_versions
from xformopt.stale import sweep
from xformopt.version import __version__

_log = logging.getLogger(__name__)
SCHEMA = 1  # raise it when what a predictor returns changes: older files then miss


def key(stage, spec, heldout, predictor, threads: int) -> str | None:
    """The content key of the baseline's outputs, or None where they are not kept (not a PyTorch stage, or rows
    with per-task payloads)."""
    if stage.kind != "hf" or heldout.extra:
        return None
    digest = hashlib.sha256(json.dumps([SCHEMA, __version__, hash_dir(stage.path), spec.task, predictor.max_length,
                                        threads, library_versions()]).encode())
    digest.update(json.dumps([heldout.texts, heldout.text_pairs]).encode())
    return digest.hexdigest()[:24]


def _path(entry_key: str) -> Path:
    return store("baseline-outputs") / f"{entry_key}.npy"


def load(entry_key: str, rows: int) -> np.ndarray | None:
    path = _path(entry_key)
    try:
        outputs = np.load(path, allow_pickle=False)
    except (OSError, ValueError):  # absent or damaged: recomputed
        return None
    if outputs.ndim == 0 or outputs.shape[0] != rows:
        return None
    touch(path)
    return outputs


def save(entry_key: str, outputs: np.ndarray) -> None:
    if not isinstance(outputs, np.ndarray) or outputs.dtype.kind not in "biuf":
        return  # per-row objects (spans, tag lists) are not kept
    path = _path(entry_key)
    sweep(path.parent)  # temp files of runs killed while saving
    with replacing(path) as tmp, open(tmp, "xb") as handle:
        np.save(handle, outputs, allow_pickle=False)


def baseline_outputs(stage, spec, heldout, predictor, threads: int,
                     progress: Callable[[int, int], None]) -> tuple[np.ndarray, bool]:
    """(the stage's outputs on the held-out rows, whether they were read from disk)."""
    entry_key = key(stage, spec, heldout, predictor, threads)
    if entry_key is not None and (outputs := load(entry_key, len(heldout))) is not None:
        _log.info(f"{stage.name}: outputs on the {len(heldout)} held-out rows read from {_path(entry_key)} "
                  "(same model, rows, task, threads and library versions)")
        return outputs, True
    outputs = predictor.predict_data(heldout, progress=progress)
    if entry_key is not None:
        save(entry_key, outputs)
    return outputs, False
