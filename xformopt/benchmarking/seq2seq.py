"""``xformopt bench`` of an encoder-decoder artifact: what ``optimize`` measured for it, measured again.

The same held-out rows and generation settings as the report (beams and the new-token bound from the
report's ``artifact.generation``, else as the evaluation derives them), scored with the task's metrics
(BLEU/chrF or ROUGE) and, where ``reference/`` holds the fp32 model's generated ids for these rows, the
share of identical outputs and the teacher-forced next-token agreement; then one sentence at a time end
to end (tokenize, generate, decode), alone, in repeats: the same call ``evaluate/seq2seq.py`` times for
the report, so the gate compares like with like. ``tokens_per_s``: mean decoded tokens per row over the
mean solo call.
"""

from __future__ import annotations

import logging

from xformopt.benchmarking.measure import Artifact, Plan, document, reference_for
from xformopt.errors import InputError
from xformopt.evaluate.seq2seq import AGREEMENT_ROWS, generation_settings, solo_sentences, tokens_per_s
from xformopt.models import load_tokenizer
from xformopt.seq2seq.generate import decode_loop
from xformopt.seq2seq.measure import decode, forced_agreement, generate_rows, sentence_call
from xformopt.seq2seq.runner import OrtSeq2Seq
from xformopt.seq2seq.search_graph import open_search_graph

_log = logging.getLogger(__name__)


def settings_for(artifact: Artifact):
    """The generation settings the report used (its ``artifact.generation``), else the evaluation's rule."""
    generation = generation_settings(artifact.path, artifact.evaluation.num_beams)
    used = (artifact.report or {}).get("artifact", {}).get("generation") or {}
    return generation.with_(**{k: int(used[k]) for k in ("num_beams", "max_new_tokens") if isinstance(used.get(k), int)})


def open_runner(artifact: Artifact, threads: int) -> OrtSeq2Seq:
    """The artifact's two graphs in ONNX Runtime; a damaged graph is bad input (exit 2)."""
    try:
        return OrtSeq2Seq(artifact.path, threads=threads, search=open_search_graph(artifact.path, threads))
    except Exception as exc:  # onnxruntime raises its own types for damaged files
        reason = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise InputError(f"cannot load the artifact {artifact.path} ({type(exc).__name__}: {reason}); re-run optimize") from None


def reference_rows(artifact: Artifact, heldout, notes: list[str]) -> list[list[int]] | None:
    """The fp32 model's generated ids for these rows (reference/, padded with -1), or None with a note."""
    outputs, reason = reference_for(artifact, heldout)
    if outputs is None:
        note = f"same_output_as_baseline and next_token_agreement skipped: {reason}"
        _log.info(f"note: {note}")
        notes.append(note)
        return None
    return [[int(t) for t in row if t >= 0] for row in outputs]


def measure(artifact: Artifact, run: Plan) -> dict:
    """Score and time the artifact; returns the bench document without its ``comparison``."""
    s, heldout = run.settings, run.heldout
    notes = list(run.notes)
    runner = open_runner(artifact, s["threads"])
    tokenizer = load_tokenizer(artifact.path, artifact.spec.trust_remote_code)
    generation = settings_for(artifact)
    texts = list(heldout.texts)
    _log.info(f"generating for {len(texts)} held-out sources ({generation.num_beams} beam(s), up to "
              f"{generation.max_new_tokens} tokens)")
    rows = generate_rows(runner, tokenizer, texts, generation)
    base = reference_rows(artifact, heldout, notes)
    agree = None if base is None else forced_agreement(runner, tokenizer, texts[:AGREEMENT_ROWS], base[:AGREEMENT_ROWS])
    metrics = artifact.spec.task_def.score_texts(decode(tokenizer, rows), None if base is None else decode(tokenizer, base),
                                                 heldout, s["seed"], next_token_agreement=agree)
    _log.info(f"timing one sentence end to end, alone ({s['repeats']} repeats x {s['rounds']} rounds, {s['threads']} threads)")
    latency = solo_sentences(sentence_call(runner, tokenizer, texts, generation), len(texts), s["rounds"],
                             s["warmup"], s["repeats"])
    measured = {"stage": artifact.stage, "latency": latency, "metrics": metrics,
                "tokens_per_s": tokens_per_s(rows, latency["mean_ms"]),
                "generation": {"num_beams": generation.num_beams, "max_new_tokens": generation.max_new_tokens,
                               "decode_loop": decode_loop(runner, generation)}}
    return document(artifact, s, measured, notes)
