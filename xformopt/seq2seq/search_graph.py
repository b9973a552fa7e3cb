"""Generation through an artifact's ``generate.onnx`` (:mod:`xformopt.seq2seq.beam_search_graph`): one ONNX Runtime
``run`` per call, the whole search in C++, instead of one ``run`` per step and the search in Python.

The op's own rules, and how a call is held to ours (:mod:`xformopt.seq2seq.generate`, transformers'):

- lengths count the decoder start token: ``max_length = 1 + max_new_tokens``, ``min_length = 1 + min_new_tokens``;
- a finished hypothesis is kept without its EOS token and the op pads the rest; the graph's pad id is -1 (never a
  token), so the end is unambiguous, and a hypothesis shorter than ``max_new_tokens`` ended at EOS, which is put back;
- greedy is the op with one beam (``GreedySearch`` has no T5 branch): the first EOS that wins the arg-max ends the
  search, since the stop check compares the best candidate's score with that same hypothesis'; length penalty 0
  keeps the scores plain sums (a penalty of 1.0 gave the same rows on 100 of 100: docs/seq2seq.md);
- beams that reach ``max_new_tokens`` are scored over their length plus the start token (transformers: the generated
  tokens), so where the best beam is such a capped one, :func:`xformopt.seq2seq.generate.generate` redoes the row in
  Python (:meth:`OrtSearchGraph.capped`);
- its stop rule is transformers' ``early_stopping=False`` heuristic; ``True`` and ``"never"`` are not the graph's;
- one row per call: beam search over several rows stays in Python, as ORT's stop check reads row ``b``'s best score
  at offset ``b * beams`` of scores laid out ``2 * beams`` per row, so rows after the first may stop early (a measured
  example in docs/seq2seq.md); greedy batches give the loop's tokens but measured slower in the op than in the
  Python loop's batched steps (0.92-0.96x at t5-small's shapes, batch 8), so they stay in Python too;
- several beams need at least two new tokens: with one (``max_length`` 2) the op feeds its decoder an unset buffer;
- one EOS id, no forced BOS/EOS and no banned tokens: T5's generation configs. Anything else returns a reason,
  and the caller runs the Python loop.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from xformopt.families import family_of
from xformopt.runtime.session import ort_session
from xformopt.seq2seq.beam_search_graph import (
    GENERATE_FILE,
    METADATA_KEY,
    SEARCH_GRAPH_PAD,
    build_search_model,
    graph_digests,
)
from xformopt.seq2seq.generate import GenerationSettings, generate
from xformopt.seq2seq.runner import OrtSeq2Seq
from xformopt.seq2seq.search_rewrites import runs_onnx_attention

log = logging.getLogger(__name__)
CHECK_ROWS = 4  # sample sources a stage's search graph is checked on (greedy and 4 beams) before it is kept


class OrtSearchGraph:
    """``generate.onnx`` in an ONNX Runtime session."""

    def __init__(self, path: str | Path, threads: int | None = None):
        self.path = Path(path)
        self.session = ort_session(self.path, threads)
        meta = self.session.get_modelmeta().custom_metadata_map
        self.fixed = json.loads(meta[METADATA_KEY])
        self.said: set[str] = set()  # the fallback reasons logged so far (each once)

    def unfit(self, settings: GenerationSettings, batch: int = 1, padded: bool = False) -> str | None:
        """Why this graph cannot run ``settings`` over ``batch`` rows (``padded``: with padding) as the Python loop
        would (None: it can)."""
        fixed = self.fixed
        if batch > 1 and settings.num_beams > 1:
            # ORT's scorer reads row b's best score for its stop check at b * beams, not b * 2 * beams
            # (beam_search_scorer.cc): a row past the first may stop early (measured: docs/seq2seq.md)
            return "beam search over a batch of several rows (ORT's stop check reads another row's scores)"
        if settings.num_beams > 1 and settings.max_new_tokens < 2:
            # measured: ORT's op then feeds the decoder a token id read from an unset buffer (an out-of-range
            # Gather error, or whatever tokens that memory held): docs/seq2seq.md
            return "one new token with several beams (ORT's BeamSearch reads an unset buffer there)"
        if batch > 1:  # the op's tokens are the loop's here (tested), its speed is not (docs/seq2seq.md)
            return "a greedy batch of several rows (measured slower in the op than in the Python loop)"
        if padded and fixed.get("unpadded"):  # its padding masks are gone (xformopt/seq2seq/search_rewrites.py)
            return "a padded source (the search graph decodes unpadded rows)"
        if settings.eos_token_id != (fixed["eos_token_id"],):
            return f"EOS ids {list(settings.eos_token_id)}: the graph stops at {fixed['eos_token_id']} only"
        if settings.decoder_start_token_id != fixed["decoder_start_token_id"]:
            return "another decoder start token than the graph's"
        if settings.no_repeat_ngram_size != fixed["no_repeat_ngram_size"]:
            return f"no_repeat_ngram_size {settings.no_repeat_ngram_size} (the graph's: {fixed['no_repeat_ngram_size']})"
        if settings.forced_bos_token_id is not None or settings.forced_eos_token_id or settings.banned_token_ids:
            return "forced BOS/EOS or banned tokens (the op has no such rule)"
        if settings.early_stopping is not False:
            return f"early_stopping={settings.early_stopping!r} (the op's stop rule is early_stopping=False's)"
        return None

    def capped(self, rows: list[list[int]], settings: GenerationSettings) -> list[int]:
        """Rows whose best beam ran to ``max_new_tokens`` without EOS while EOS was allowed: there the op's ranking is
        not transformers' (its unfinished beams are scored over one more position than generated, the start token
        counted, so a capped beam can beat an EOS-ended one transformers keeps: docs/seq2seq.md). The caller redoes
        them in Python. With one beam, or EOS banned to the end (min = max new tokens), the two rank alike."""
        if settings.num_beams == 1 or settings.min_new_tokens >= settings.max_new_tokens:
            return []
        eos = self.fixed["eos_token_id"]
        return [i for i, row in enumerate(rows) if len(row) >= settings.max_new_tokens and row[-1] != eos]

    def generate(self, input_ids: np.ndarray, attention_mask: np.ndarray, settings: GenerationSettings) -> list[list[int]]:
        """Generated token ids per row, as :func:`xformopt.seq2seq.generate.generate` returns them."""
        best = self.session.run(None, search_feed(input_ids, attention_mask, settings))[0][:, 0]  # the best hypothesis
        sequences = best[:, 1:]  # after the start token
        eos = self.fixed["eos_token_id"]
        rows = []
        for row in sequences.tolist():
            ends = row.index(SEARCH_GRAPH_PAD) if SEARCH_GRAPH_PAD in row else len(row)
            rows.append(row[:ends] + ([eos] if ends < settings.max_new_tokens else []))
        return rows


def search_feed(input_ids: np.ndarray, attention_mask: np.ndarray, settings: GenerationSettings) -> dict:
    """The op's inputs for ``settings`` (its lengths count the start token; greedy with length penalty 0)."""
    def one(value, dtype):
        return np.asarray([value], dtype=dtype)

    return {"input_ids": input_ids.astype(np.int32), "attention_mask": attention_mask.astype(np.int32),
            "max_length": one(1 + settings.max_new_tokens, np.int32),
            "min_length": one(1 + settings.min_new_tokens, np.int32),
            "num_beams": one(settings.num_beams, np.int32), "num_return_sequences": one(1, np.int32),
            "length_penalty": one(0.0 if settings.num_beams == 1 else settings.length_penalty, np.float32),
            "repetition_penalty": one(1.0, np.float32)}


def open_search_graph(folder: Path, threads: int | None) -> OrtSearchGraph | None:
    """The artifact's search graph when it has one that embeds its current two graphs (None otherwise: the Python
    loop runs); the choice is logged."""
    path = Path(folder) / GENERATE_FILE
    if not path.is_file():
        log.info("%s has no %s: generation runs the Python decode loop", folder, GENERATE_FILE)
        return None
    search = OrtSearchGraph(path, threads)
    if search.fixed.get("graphs") != graph_digests(folder):
        log.warning("%s embeds other graphs than %s's encoder.onnx/decoder.onnx (a later step rewrote them): "
                    "generation runs the Python decode loop", path, folder)
        return None
    log.info("generation runs in ONNX Runtime's BeamSearch op (%s) where the settings allow", path)
    return search


def refusal(folder: Path, settings: GenerationSettings) -> str | None:
    """Why an artifact gets no search graph (None: it gets one)."""
    config = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    model_type = config.get("model_type")
    if not family_of(model_type).search_graph:
        return f"{model_type}: ONNX Runtime's BeamSearch op has no branch for this family; the Python loop decodes"
    if len(settings.eos_token_id) != 1:
        return f"the generation config names {len(settings.eos_token_id)} EOS ids; the op takes one"
    if settings.no_repeat_ngram_size:
        return "the generation config sets no_repeat_ngram_size (the op's rule would read the graph's pad id -1 as a token)"
    if settings.forced_bos_token_id is not None or settings.forced_eos_token_id or settings.banned_token_ids:
        return "the generation config forces BOS/EOS or bans tokens (rules the op lacks)"
    return None


def write_search_graph(folder: Path, texts: list[str], tokenizer, threads: int | None) -> dict:
    """Write ``generate.onnx`` beside the artifact's two graphs where the family and generation config allow, then
    check it: greedy and 4 beams over ``texts`` must give the Python loop's tokens on the same graphs, else the file
    is removed. Returns the record (``file`` None with the ``reason`` where there is none)."""
    import onnx

    folder = Path(folder)
    path = folder / GENERATE_FILE
    path.unlink(missing_ok=True)  # a stage copied from the previous one carries that stage's
    settings = GenerationSettings.from_model_dir(folder)
    reason = refusal(folder, settings)
    tried = []
    # the ONNX Attention kernel computes the same scores another way: where its tokens differ, the graph without it
    for onnx_attention in ((True, False) if runs_onnx_attention() else (False,)) if reason is None else ():
        model, rewrites = build_search_model(folder, settings.eos_token_id[0], settings.decoder_start_token_id,
                                             onnx_attention)
        if model.ByteSize() >= 2**31 - 2**24:
            reason = "the two graphs together pass protobuf's 2 GB: no single-file search graph"
            break
        onnx.save(model, str(path))
        try:
            reason = _disagreement(folder, texts, tokenizer, settings, threads)
        except Exception as err:  # noqa: BLE001  # ORT refused the graph (an op or shape it lacks): the next build
            reason = f"ONNX Runtime could not run it: {type(err).__name__}: {str(err).splitlines()[0][:200]}"
        tried.append({**rewrites, "agreed": reason is None})
        if reason is None or not rewrites["onnx_attention"]:
            break
    if reason is not None:
        path.unlink(missing_ok=True)
        log.info("no %s: %s", GENERATE_FILE, reason)
        return {"file": None, "reason": reason, **({"tried": tried} if tried else {})}
    return {"file": GENERATE_FILE, "bytes": path.stat().st_size, "checked_rows": len(texts), "rewrites": tried[-1],
            "tried": tried, "reason": "the whole decode loop in ONNX Runtime's BeamSearch op: greedy and 4 beams gave "
                                      "the Python loop's tokens on the checked rows"}


def _disagreement(folder: Path, texts: list[str], tokenizer, settings: GenerationSettings, threads) -> str | None:
    """None where the search graph gives the Python loop's tokens for every text, greedy and 4 beams (batch 1)."""
    runner, search = OrtSeq2Seq(folder, threads=threads), OrtSearchGraph(folder / GENERATE_FILE, threads)
    for beams in (1, 4):
        wanted = settings.with_(num_beams=beams, max_new_tokens=min(settings.max_new_tokens, 32))
        for text in texts:
            enc = tokenizer([text], return_tensors="np")
            ids, mask = enc["input_ids"].astype(np.int64), enc["attention_mask"].astype(np.int64)
            ours, theirs = generate(runner, ids, mask, wanted), search.generate(ids, mask, wanted)
            if ours != theirs:
                return (f"the BeamSearch graph's tokens differ from the Python loop's ({beams} beam(s), {text[:40]!r}: "
                        f"{theirs[0][:12]} vs {ours[0][:12]})")
    return None
