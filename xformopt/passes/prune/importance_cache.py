"""Taylor importance kept on disk, so a shape search scores a teacher once.

Every trial of a shape search prunes the same teacher on the same seeded sample: the head, FFN and
layer-drop scores are the same each time, and on a base-size teacher they cost minutes (MPNet-base,
2 cores: about 4 minutes, nearly all of it the layer-drop sensitivity: one sample pass per layer). The
key is everything the scores depend on: the model folder's content hash, the objective, the batched
sample (token ids, masks and labels, in order), the seed and a schema version, so a changed model,
sample or tokenizer misses it. Stored as a plain ``.npz`` (read with ``allow_pickle=False``: no pickle)
written to a temporary sibling and renamed into place, so a killed run never leaves a half-written entry
that a later one would read (its temporary file is swept by the next save).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from xformopt.atomic import replacing
from xformopt.cache_stores import store, touch
from xformopt.stale import sweep

SCHEMA = 1  # raise it when the scoring changes: older entries then miss instead of being read


def folder() -> Path:
    return store("prune-importance")


def key(model_hash: str, objective: str, batches, seed: int) -> str:
    """Content key of one importance computation (``batches``: the pass's ``Batches``)."""
    digest = hashlib.sha256(json.dumps([SCHEMA, model_hash, objective, seed]).encode())
    for b, enc in enumerate(batches.encoded):
        for name in sorted(enc):
            digest.update(name.encode())
            digest.update(enc[name].numpy().tobytes())
        if batches.labels is not None:
            digest.update(batches.labels[b].numpy().tobytes())
        digest.update(b"|")
    return digest.hexdigest()[:24]


def load(entry_key: str) -> tuple[list, list, list] | None:
    """(head scores per layer, FFN scores per layer, layer scores), or None when absent or unreadable."""
    path = folder() / f"{entry_key}.npz"
    try:
        with np.load(path, allow_pickle=False) as data:
            layers = int(data["layers"].size)
            heads = [data[f"head_{i}"].astype(np.float64) for i in range(layers)]
            ffn = [data[f"ffn_{i}"].astype(np.float64) for i in range(layers)]
            scores = heads, ffn, [float(x) for x in data["layers"]]
    except (OSError, KeyError, ValueError):  # absent, truncated or from another schema: recompute
        return None
    touch(path)
    return scores


def save(entry_key: str, heads: list, ffn: list, layers: list) -> Path:
    path = folder() / f"{entry_key}.npz"
    sweep(path.parent)  # temp files of runs killed while saving
    arrays = {"layers": np.asarray(layers, dtype=np.float64)}
    arrays.update({f"head_{i}": np.asarray(h, dtype=np.float64) for i, h in enumerate(heads)})
    arrays.update({f"ffn_{i}": np.asarray(f, dtype=np.float64) for i, f in enumerate(ffn)})
    with replacing(path) as tmp, open(tmp, "xb") as handle:
        np.savez(handle, **arrays)
    return path
