"""Greedy and beam search over a seq2seq runner (:mod:`xformopt.seq2seq.runner`), with the generation
config's rules: decoder start token, EOS (one or several), forced BOS/EOS, minimum length, banned
single tokens, no-repeat n-grams, beam width, length penalty and early stopping.

Hand-written, not ``transformers.generate``: the runner here is two ONNX Runtime sessions, not a torch
module. The beam search follows transformers' vectorised ``_beam_search`` step for step (top
``2 x beams`` continuations, finished hypotheses scored ``sum log p / generated ** length_penalty``,
the same early-stop heuristic) so that an artifact's beams are PyTorch's.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, fields, replace
from pathlib import Path

import numpy as np

from xformopt.errors import InputError

log = logging.getLogger(__name__)
NEG = -1.0e9
NEG32 = np.float32(NEG)  # beam scores stay float32: a Python float times a bool array would make them float64


@dataclass(frozen=True)
class GenerationSettings:
    decoder_start_token_id: int
    eos_token_id: tuple[int, ...]
    pad_token_id: int
    max_new_tokens: int = 64
    num_beams: int = 1
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    min_new_tokens: int = 0
    forced_bos_token_id: int | None = None
    forced_eos_token_id: tuple[int, ...] = ()
    no_repeat_ngram_size: int = 0
    banned_token_ids: tuple[int, ...] = ()  # single-token bad_words_ids (Marian bans its pad token)

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise InputError(f"--max-new-tokens must be >= 1 (got {self.max_new_tokens})")
        if self.num_beams < 1:
            raise InputError(f"--num-beams must be >= 1 (got {self.num_beams})")

    @classmethod
    def from_model_dir(cls, path: str | Path, **overrides) -> GenerationSettings:
        """The model's generation config (generation_config.json, else config.json, as transformers
        reads them: a generation config file replaces the config's generation keys), then ``overrides``
        (the ones not None). The start and pad tokens fall back to config.json."""
        path = Path(path)
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
        gen_file = path / "generation_config.json"
        gen = json.loads(gen_file.read_text(encoding="utf-8")) if gen_file.is_file() else dict(config)
        for key in ("decoder_start_token_id", "pad_token_id", "eos_token_id"):
            if gen.get(key) is None:
                gen[key] = config.get(key)

        def ids(value) -> tuple[int, ...]:
            return () if value is None else tuple(int(v) for v in (value if isinstance(value, list) else [value]))

        start = gen.get("decoder_start_token_id", gen.get("pad_token_id"))
        if start is None:
            raise InputError(f"{path}: the generation config names no decoder_start_token_id; re-save it with "
                             "save_pretrained()")
        max_new = gen.get("max_new_tokens") or (int(gen["max_length"]) - 1 if gen.get("max_length") else 64)
        banned = tuple(w[0] for w in (gen.get("bad_words_ids") or []) if isinstance(w, list) and len(w) == 1)
        values = dict(decoder_start_token_id=int(start), eos_token_id=ids(gen.get("eos_token_id")),
                      pad_token_id=int(gen.get("pad_token_id") if gen.get("pad_token_id") is not None else start),
                      max_new_tokens=int(max_new), num_beams=int(gen.get("num_beams") or 1),
                      length_penalty=float(gen.get("length_penalty", 1.0)),
                      early_stopping=gen.get("early_stopping", False),
                      min_new_tokens=max(int(gen.get("min_new_tokens") or 0), int(gen.get("min_length") or 0) - 1),
                      forced_bos_token_id=gen.get("forced_bos_token_id"),
                      forced_eos_token_id=ids(gen.get("forced_eos_token_id")),
                      no_repeat_ngram_size=int(gen.get("no_repeat_ngram_size") or 0), banned_token_ids=banned)
        known = {f.name for f in fields(cls)}
        values.update({k: v for k, v in overrides.items() if v is not None and k in known})
        return cls(**values)

    def with_(self, **changes) -> GenerationSettings:
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


def process(scores: np.ndarray, sequences: np.ndarray, settings: GenerationSettings) -> np.ndarray:
    """transformers' logits processors that generation configs of these families set, in its order,
    on ``scores`` [rows, vocab] given the ``sequences`` so far (start token included)."""
    generated = sequences.shape[1] - 1
    n = settings.no_repeat_ngram_size
    if n and sequences.shape[1] >= n:
        for row, seq in enumerate(sequences.tolist()):
            prefix = tuple(seq[len(seq) - n + 1:])
            banned = {seq[i + n - 1] for i in range(len(seq) - n + 1) if tuple(seq[i:i + n - 1]) == prefix}
            scores[row, list(banned)] = -np.inf
    if settings.banned_token_ids:
        scores[:, list(settings.banned_token_ids)] = -np.inf
    if generated < settings.min_new_tokens and settings.eos_token_id:
        scores[:, list(settings.eos_token_id)] = -np.inf
    if generated == 0 and settings.forced_bos_token_id is not None:
        scores[:] = -np.inf
        scores[:, settings.forced_bos_token_id] = 0
    if generated == settings.max_new_tokens - 1 and settings.forced_eos_token_id:
        scores[:] = -np.inf
        scores[:, list(settings.forced_eos_token_id)] = 0
    return scores


def generate(runner, input_ids: np.ndarray, attention_mask: np.ndarray, settings: GenerationSettings) -> list[list[int]]:
    """Generated token ids per row (the start token and padding left out; EOS kept where reached): in the runner's
    BeamSearch graph where it has one that takes ``settings`` (one ONNX Runtime call), else in the Python loop."""
    if decode_loop(runner, settings, len(input_ids), padded=not attention_mask.all()) == ORT_LOOP:
        rows = runner.search.generate(input_ids, attention_mask, settings)
        for i in runner.search.capped(rows, settings):  # the op ranks length-capped beams by its own rule: redone here
            rows[i] = beam_search(runner, input_ids[i:i + 1], attention_mask[i:i + 1], settings)[0]
        return rows
    search = greedy if settings.num_beams == 1 else beam_search
    return search(runner, input_ids, attention_mask, settings)


ORT_LOOP, PYTHON_LOOP = "onnxruntime BeamSearch op", "python"


def decode_loop(runner, settings: GenerationSettings, batch: int = 1, padded: bool = False) -> str:
    """Which loop :func:`generate` runs for ``settings`` over ``batch`` rows (``padded``: with padding) on ``runner``
    (a record field); a fallback's reason is logged once per reason and search graph."""
    search = getattr(runner, "search", None)
    if search is None:
        return PYTHON_LOOP
    reason = search.unfit(settings, batch, padded)
    if reason is not None and reason not in search.said:
        search.said.add(reason)
        log.info("the Python decode loop runs: %s", reason)
    return PYTHON_LOOP if reason else ORT_LOOP


def _strip(sequences: np.ndarray, settings: GenerationSettings) -> list[list[int]]:
    out = []
    for seq in sequences[:, 1:].tolist():
        for j, token in enumerate(seq):
            if token in settings.eos_token_id:
                seq = seq[:j + 1]
                break
        out.append(seq)
    return out


def greedy(runner, input_ids, attention_mask, settings: GenerationSettings) -> list[list[int]]:
    """Arg-max decoding of every row at once; a finished row is fed padding until all are done (as
    transformers does), so a batch's rows equal their batch-1 results."""
    logits, cache = runner.start(input_ids, attention_mask)
    sequences = np.full((len(input_ids), 1), settings.decoder_start_token_id, dtype=np.int64)
    done = np.zeros(len(input_ids), dtype=bool)
    eos = np.asarray(settings.eos_token_id or [-1])
    for step in range(settings.max_new_tokens):
        if step:
            logits, cache = runner.step(sequences[:, -1:], cache)
        token = process(logits.copy(), sequences, settings).argmax(-1)
        token = np.where(done, settings.pad_token_id, token)
        sequences = np.concatenate([sequences, token[:, None]], axis=1)
        done |= _is_eos(token, eos)
        if done.all():
            break
    return _strip(sequences, settings)


def beam_search(runner, input_ids, attention_mask, settings: GenerationSettings) -> list[list[int]]:
    """transformers' beam search (see the module doc), the best beam per row."""
    batch, beams = len(input_ids), settings.num_beams
    max_length = 1 + settings.max_new_tokens
    keep = max(2, 1 + len(settings.eos_token_id)) * beams
    logits, cache = runner.start(input_ids, attention_mask)
    rows = np.repeat(np.arange(batch), beams)
    logits, cache = logits[rows], cache.select(rows)
    running = np.full((batch, beams, max_length), settings.pad_token_id, dtype=np.int64)
    running[:, :, 0] = settings.decoder_start_token_id
    # scores in float32, as transformers keeps them (and half the bytes to rank per step)
    running_scores = np.full((batch, beams), NEG, dtype=np.float32)
    running_scores[:, 0] = 0.0
    finished = np.full((batch, beams, max_length), settings.pad_token_id, dtype=np.int64)
    finished_scores = np.full((batch, beams), NEG, dtype=np.float32)
    finished_lengths = np.ones((batch, beams), dtype=np.int64)
    is_finished = np.zeros((batch, beams), dtype=bool)
    improvable = np.ones((batch, 1), dtype=bool)
    top_beams = np.arange(keep) < beams
    eos = np.asarray(settings.eos_token_id or [-1])
    cur = 1
    while True:
        flat = running[:, :, :cur].reshape(batch * beams, cur)
        log_probs = _log_softmax(logits)
        log_probs = process(log_probs, flat, settings).reshape(batch, beams, -1)
        vocab = log_probs.shape[-1]
        total = (log_probs + running_scores[:, :, None]).reshape(batch, -1)
        top = top_k(total, keep)
        top_scores = np.take_along_axis(total, top, axis=1)
        src_beam, token = top // vocab, top % vocab
        candidates = np.take_along_axis(running, src_beam[:, :, None], axis=1).copy()
        candidates[:, :, cur] = token
        hits = _is_eos(token, eos) | (cur + 1 >= max_length)
        # e. the best unfinished continuations run on
        alive_scores = top_scores + hits * NEG32
        nxt = np.argsort(-alive_scores, axis=1, kind="stable")[:, :beams]
        running = np.take_along_axis(candidates, nxt[:, :, None], axis=1)
        running_scores = np.take_along_axis(alive_scores, nxt, axis=1)
        beam_rows = (np.take_along_axis(src_beam, nxt, axis=1) + np.arange(batch)[:, None] * beams).reshape(-1)
        # f. finished hypotheses among the top ``beams`` candidates, length-penalised
        just_done = hits & top_beams[None, :]
        scored = top_scores / ((cur + 1 - 1) ** settings.length_penalty)
        full = is_finished.all(axis=1, keepdims=True) & (settings.early_stopping is True)
        scored = scored + full * NEG32 + (~improvable) * NEG32 + (~just_done) * NEG32
        merged_seq = np.concatenate([finished, candidates], axis=1)
        merged_scores = np.concatenate([finished_scores, scored], axis=1)
        merged_len = np.concatenate([finished_lengths, np.full((batch, keep), cur + 1)], axis=1)
        merged_done = np.concatenate([is_finished, just_done], axis=1)
        best = np.argsort(-merged_scores, axis=1, kind="stable")[:, :beams]
        finished = np.take_along_axis(merged_seq, best[:, :, None], axis=1)
        finished_scores = np.take_along_axis(merged_scores, best, axis=1)
        finished_lengths = np.take_along_axis(merged_len, best, axis=1)
        is_finished = np.take_along_axis(merged_done, best, axis=1)
        cur += 1
        # the early-stop heuristic (transformers' ``_check_early_stop_heuristic``)
        length = (max_length - 1) if settings.early_stopping == "never" and settings.length_penalty > 0 else cur - 1
        best_running = running_scores[:, :1] / (length ** settings.length_penalty)
        worst_finished = np.where(is_finished, finished_scores.min(axis=1, keepdims=True), NEG)
        improvable = improvable & np.any(best_running > worst_finished, axis=-1, keepdims=True)
        open_beam = not (is_finished.all() and settings.early_stopping is True)
        if not (improvable.any() and open_beam and not hits.all()) or cur >= max_length:
            break
        cache = cache.reorder(beam_rows)
        logits, cache = runner.step(running[:, :, cur - 1].reshape(-1, 1), cache)
    out = []
    for b in range(batch):
        seq = finished[b, 0, :finished_lengths[b, 0]]
        out.append(seq)
    return _strip(_pad(out, settings.pad_token_id), settings)


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Per row, the indices of the ``k`` largest scores, exactly ``np.argsort(-scores, kind="stable")[:, :k]``
    (descending, a tie to the lower index) without sorting the row: beam search ranks beams x vocabulary
    scores per step, and sorting 4 x 32128 took 50 ms of a 60 ms t5-small step."""
    if scores.shape[1] <= 4 * k:
        return np.argsort(-scores, axis=1, kind="stable")[:, :k]
    n = scores.shape[1]
    kth = np.partition(scores, n - k, axis=1)[:, n - k]  # the k-th largest value of each row
    out = np.empty((len(scores), k), dtype=np.int64)
    for r, (row, value) in enumerate(zip(scores, kth)):
        above = np.flatnonzero(row > value)
        tied = np.flatnonzero(row == value)[:k - len(above)]  # the lowest indices among ties at the k-th place
        picked = np.concatenate([above, tied])
        out[r] = picked[np.argsort(-row[picked], kind="stable")]
    return out


def _is_eos(tokens: np.ndarray, eos: np.ndarray) -> np.ndarray:
    """``np.isin(tokens, eos)`` for the one to few EOS ids of a generation config (np.isin took 0.2 ms a step)."""
    return (tokens[..., None] == eos).any(axis=-1)


def _pad(rows: list[np.ndarray], pad: int) -> np.ndarray:
    width = max(len(r) for r in rows)
    out = np.full((len(rows), width), pad, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return out


def _log_softmax(x: np.ndarray) -> np.ndarray:
    """A new float32 array (the runner's logits are left as they are)."""
    x = np.asarray(x, dtype=np.float32)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))
