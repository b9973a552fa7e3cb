"""Training data for distillation: tokenized once, batched by length, the teacher's outputs computed once.

- Texts are tokenized once, without padding; a batch is padded (right, with the tokenizer's pad id)
  when it is formed, so the student and the teacher see the very same ids, mask and padding.
- Batches: each epoch is a seeded permutation (``numpy.random.default_rng([seed, epoch])``, so the
  order of any epoch is known without replaying earlier ones: resume needs no data state); the
  permutation is cut into pools of 50 batches, each pool sorted by length (little padding), and the
  batches are shuffled.
- The teacher's outputs: logits or pooled embeddings for every row (float32, a few KB per 1000
  rows), and, only when the hidden-state loss is on, the token states of the mapped teacher layers in
  float16, unpadded (sum of lengths x hidden x layers x 2 bytes), if that fits ``cache_mb``;
  otherwise the teacher runs beside the student on each batch (``online``). Attention maps are never
  cached (they grow with the square of the length): with ``attention_weight`` the teacher runs online.
- The logits/embeddings (and the cached hidden states) are also kept on disk, keyed by the teacher's content
  hash and the texts as the teacher's tokenizer cuts them (``<xformopt cache>/distill-teacher/``), so a resumed
  or repeated run, another shape, or a pretrained student with its own tokenizer (rows align by text:
  xformopt/passes/distill/pretrained.py) skips the teacher pass.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from xformopt.atomic import replacing
from xformopt.scoring.pooling import mean_pool

POOL_BATCHES = 50


@dataclass
class Encoded:
    ids: list[np.ndarray]  # per row, int64, unpadded
    types: list[np.ndarray] | None
    labels: np.ndarray | None
    pad_id: int

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def lengths(self) -> np.ndarray:
        return np.array([len(i) for i in self.ids], dtype=np.int64)


def encode(tokenizer, texts: Sequence[str], pairs: Sequence[str] | None, labels, max_length: int) -> Encoded:
    enc = tokenizer(list(texts), list(pairs) if pairs else None, truncation=True, max_length=max_length)
    ids = [np.asarray(x, dtype=np.int64) for x in enc["input_ids"]]
    types = [np.asarray(x, dtype=np.int64) for x in enc["token_type_ids"]] if "token_type_ids" in enc else None
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return Encoded(ids, types, None if labels is None else np.asarray(labels, dtype=np.int64), int(pad))


def collate(data: Encoded, idx: Sequence[int], accepts: set[str]) -> dict:
    """Right-padded torch tensors for rows ``idx`` (only the inputs the model's forward takes)."""
    import torch

    width = max(len(data.ids[i]) for i in idx)
    ids = np.full((len(idx), width), data.pad_id, dtype=np.int64)
    mask = np.zeros((len(idx), width), dtype=np.int64)
    types = np.zeros((len(idx), width), dtype=np.int64)
    for r, i in enumerate(idx):
        n = len(data.ids[i])
        ids[r, :n] = data.ids[i]
        mask[r, :n] = 1
        if data.types is not None:
            types[r, :n] = data.types[i]
    out = {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)}
    if data.types is not None and "token_type_ids" in accepts:
        out["token_type_ids"] = torch.from_numpy(types)
    return out


def epoch_batches(lengths: np.ndarray, batch_size: int, seed: int, epoch: int) -> list[np.ndarray]:
    """Row indices of each batch of ``epoch``: seeded, length-bucketed within pools, shuffled."""
    rng = np.random.default_rng([seed, epoch])
    perm = rng.permutation(len(lengths))
    pool = batch_size * POOL_BATCHES
    batches = []
    for s in range(0, len(perm), pool):
        chunk = perm[s:s + pool]
        chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
        batches += [chunk[b:b + batch_size] for b in range(0, len(chunk), batch_size)]
    order = rng.permutation(len(batches))
    return [batches[i] for i in order]


def steps_per_epoch(n: int, batch_size: int) -> int:
    """The number of batches ``epoch_batches`` makes from n rows."""
    pool = batch_size * POOL_BATCHES
    full, rest = divmod(n, pool)
    return full * POOL_BATCHES + -(-rest // batch_size)


def sorted_batches(lengths: np.ndarray, batch_size: int) -> list[np.ndarray]:
    """Fixed batches by length (inference: teacher outputs and evaluation)."""
    order = np.argsort(lengths, kind="stable")
    return [order[s:s + batch_size] for s in range(0, len(order), batch_size)]


def forward(model, enc: dict, objective: str, *, hidden: bool = False, attentions: bool = False):
    """(main output, hidden states or None, attentions or None). Main output: logits, or the
    mean-pooled last hidden state (the embedding xformopt's runners and report use)."""
    kwargs = {}
    if hidden:
        kwargs["output_hidden_states"] = True
    if attentions:
        kwargs["output_attentions"] = True
    out = model(**enc, **kwargs)
    first = out[0]
    main = first if objective == "logits" else mean_pool(first, enc["attention_mask"])
    return main, (out.hidden_states if hidden else None), (out.attentions if attentions else None)


@dataclass
class TeacherCache:
    main: object  # torch tensor [N, C or H], float32
    layers: list[int]  # teacher hidden-state indices cached (empty: none)
    hidden: list | None  # per cached layer: float16 tensor [sum of lengths, H]
    offsets: np.ndarray | None  # row -> start in the flat hidden tensors
    seconds: float = 0.0

    def hidden_batch(self, idx: Sequence[int], lengths: np.ndarray, width: int) -> list:
        """Cached states of rows ``idx``, zero-padded to ``width`` tokens: one [B, width, H] per layer."""
        import torch

        out = []
        for flat in self.hidden:
            padded = torch.zeros((len(idx), width, flat.shape[-1]), dtype=flat.dtype)
            for r, i in enumerate(idx):
                s, n = int(self.offsets[i]), int(lengths[i])
                padded[r, :n] = flat[s:s + n]
            out.append(padded)
        return out


def ids_digest(*datasets: Encoded) -> str:
    """Content digest of tokenized rows (ids, token types, order): part of the teacher-output cache key."""
    h = hashlib.sha256()
    for data in datasets:
        for i, ids in enumerate(data.ids):
            h.update(ids.tobytes())
            if data.types is not None:
                h.update(data.types[i].tobytes())
            h.update(b"|")
        h.update(b"#")
    return h.hexdigest()


def load_cached_main(path: Path):
    """Teacher outputs saved by ``save_cached_main`` (safetensors: no pickle): (train main, held-out main,
    {teacher hidden-state index: flat float16 states}, row offsets or None), or None."""
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(path))
    except (OSError, ValueError, RuntimeError):
        return None
    hidden = {int(k.split(".", 1)[1]): v for k, v in tensors.items() if k.startswith("hidden.")}
    offsets = tensors.get("offsets")
    return tensors.get("train"), tensors.get("eval"), hidden, None if offsets is None else offsets.numpy()


def save_cached_main(path: Path, train, heldout, cache: TeacherCache | None = None) -> None:
    """The teacher's main outputs and, when ``cache`` holds them, its hidden states (one flat float16 tensor per
    cached layer, by hidden-state index, and the row offsets into them)."""
    import torch
    from safetensors.torch import save_file

    tensors = {"train": train.contiguous(), "eval": heldout.contiguous()}
    if cache is not None and cache.hidden:
        tensors.update({f"hidden.{layer}": flat.contiguous() for layer, flat in zip(cache.layers, cache.hidden)})
        tensors["offsets"] = torch.from_numpy(np.ascontiguousarray(cache.offsets))
    with replacing(path) as tmp:
        save_file(tensors, str(tmp))


def hidden_cache_mb(lengths: np.ndarray, hidden_size: int, n_layers: int) -> float:
    return float(lengths.sum()) * hidden_size * n_layers * 2 / 2**20


def teacher_outputs(teacher, data: Encoded, objective: str, accepts: set[str], layers: list[int], batch_size: int,
                    device, progress=None) -> TeacherCache:
    """The teacher's main output for every row, and the states of ``layers`` (float16, unpadded) if any."""
    import torch

    started = time.perf_counter()
    lengths = data.lengths
    n = len(data)
    mains = [None] * n
    hidden = None
    offsets = None
    if layers:
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        hidden = [None] * len(layers)
    batches = sorted_batches(lengths, batch_size)
    with torch.inference_mode():
        for b, idx in enumerate(batches):
            enc = {k: v.to(device) for k, v in collate(data, idx, accepts).items()}
            main, states, _ = forward(teacher, enc, objective, hidden=bool(layers))
            main = main.float().cpu()
            for r, i in enumerate(idx):
                mains[i] = main[r]
            if layers:
                for j, layer in enumerate(layers):
                    st = states[layer].to("cpu", torch.float16)
                    if hidden[j] is None:
                        hidden[j] = torch.zeros((int(lengths.sum()), st.shape[-1]), dtype=torch.float16)
                    for r, i in enumerate(idx):
                        s, m = int(offsets[i]), int(lengths[i])
                        hidden[j][s:s + m] = st[r, :m]
            if progress:
                progress(b + 1, len(batches))
    return TeacherCache(torch.stack(mains), list(layers), hidden, offsets, time.perf_counter() - started)
