"""fuse for encoder-decoder stages (two graphs, xformopt/seq2seq/), called by that pass through its
graph-kind table; the record has the keys the pass's summary and the report read. (Their quantize:
xformopt/passes/quantize/seq2seq.py.)

- fuse: onnxscript's ORT fusion rewriter on both graphs (the dynamo graphs' attention, self and cross,
  fuses only there), then the fused decoder graph's per-step work that does not depend on the step taken out of
  it and both graphs' reshape/transpose round trips removed (xformopt/seq2seq/slim.py: nodes before and after in
  the record's ``slim``), verified against the unfused graphs (logits of the first and cached steps), and kept
  only where it is not slower: both variants generate the sample sentences, interleaved.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from xformopt.artifact import copy_stage
from xformopt.errors import PassFailed
from xformopt.measure.latency import run_interleaved
from xformopt.models import load_tokenizer
from xformopt.onnx_graph import fused_counts, load_graph
from xformopt.passes.base import PassContext
from xformopt.passes.export.dynamo import onnxscript_fusions
from xformopt.passes.timing import preferred_within_tolerance
from xformopt.seq2seq import GRAPH_FILES
from xformopt.seq2seq.generate import GenerationSettings, generate
from xformopt.seq2seq.measure import encode
from xformopt.seq2seq.parity import check_parity
from xformopt.seq2seq.runner import OrtSeq2Seq
from xformopt.seq2seq.search_graph import CHECK_ROWS, write_search_graph
from xformopt.seq2seq.slim import slim_graphs

SAMPLE_ROWS = 16  # sentences each candidate generates when timed and compared
MAX_NEW_TOKENS = 32
FUSED_PARITY = 1e-3


def _settings(path: Path) -> GenerationSettings:
    settings = GenerationSettings.from_model_dir(path)
    return settings.with_(max_new_tokens=min(settings.max_new_tokens, MAX_NEW_TOKENS), num_beams=1)


def _time(ctx: PassContext, dirs: dict[str, Path], rounds: int) -> dict[str, dict]:
    """Median ms to generate one sample sentence greedily at batch 1, per candidate, interleaved."""
    tokenizer = load_tokenizer(next(iter(dirs.values())))
    texts = list(ctx.sample_texts)[:SAMPLE_ROWS]
    encoded = [encode(tokenizer, [t]) for t in texts]
    settings = _settings(next(iter(dirs.values())))
    runners = {name: OrtSeq2Seq(path, threads=ctx.threads) for name, path in dirs.items()}
    calls = {name: (lambda i, r=r: generate(r, encoded[i]["input_ids"], encoded[i]["attention_mask"], settings))
             for name, r in runners.items()}
    stats = run_interleaved(calls, len(encoded), warmup=2, iterations=rounds, seed=0)
    return {name: {"median_ms": s.median_ms, "p90_ms": s.p90_ms, "n": s.n} for name, s in stats.items()}


def fuse_seq2seq(ctx: PassContext, src: Path, dst: Path, options) -> dict:
    work = dst / ".candidates"
    fused, plain = work / "all", work / "none"
    for cdir in (fused, plain):
        cdir.mkdir(parents=True)
        copy_stage(src, cdir)
    before, counts, rewrites = {}, {}, {}
    for name in GRAPH_FILES:
        ctx.log(f"fusing {name} (onnxscript's ORT fusions)")
        before[name] = fused_counts(load_graph(src / name))
        rewrites[name] = onnxscript_fusions(src / name, fused / name)
        counts[name] = {op: n for op, n in fused_counts(load_graph(fused / name)).items() if n}
    slim = slim_graphs(fused)
    ctx.log("slimmed: " + ", ".join(f"{n} {r['nodes_before']} -> {r['nodes_after']} nodes" for n, r in slim.items()))
    total = _sum(counts.values())
    missing = {op: (total.get(op, 0), n) for op, n in options.expect.items() if total.get(op, 0) < n}
    if missing:
        detail = ", ".join(f"{op} {got}/{want}" for op, (got, want) in missing.items())
        raise PassFailed(f"fusion fell short of what was expected: {detail} (fused counts {total})")
    attention = sum(total.get(op, 0) for op in ("Attention", "MultiHeadAttention"))
    # a generic row (a model type the table does not know) requires no fusion: the record says which fired
    if options.expect_full and attention == 0 and not ctx.spec.family.generic:
        raise PassFailed(f"no attention fused in either graph of this {ctx.spec.model_type} (fused counts {total}); "
                         "expect_full: false keeps the unfused graphs")
    tokenizer = load_tokenizer(src)
    parity = check_parity(OrtSeq2Seq(src, threads=ctx.threads), OrtSeq2Seq(fused, threads=ctx.threads), tokenizer,
                          list(ctx.sample_texts))
    if parity["max_abs_diff"] > FUSED_PARITY:
        raise PassFailed(f"fused graphs differ from the unfused ones: max |logit diff| {parity['max_abs_diff']:.2e} "
                         f"(limit {FUSED_PARITY:.0e})")
    timings = {}
    wanted = {"all": fused, "none": plain}
    if options.select == "fastest" and ctx.host_runs_target:
        ctx.log(f"timing fused and unfused graphs, one generated sentence each, interleaved ({options.timing_rounds} rounds)")
        timings = _time(ctx, wanted, options.timing_rounds)
        chosen = preferred_within_tolerance({k: t["median_ms"] for k, t in timings.items()}, ("all", "none"),
                                            options.tolerance)
        summary = ", ".join(f"{k} {t['median_ms']:.2f} ms" for k, t in timings.items())
        reason = f"median per generated sentence at batch 1 on this host ({summary})"
    else:
        chosen = "none" if options.select == "none" else "all"
        reason = f"select={options.select}" if options.select != "fastest" else \
            f"host lacks target {ctx.target.name}: not timed here, kept full fusion"
    for item in wanted[chosen].iterdir():
        shutil.move(str(item), dst / item.name)
    shutil.rmtree(work)
    kept = counts if chosen == "all" else {n: {op: v for op, v in before[n].items() if v} for n in GRAPH_FILES}
    search = write_search_graph(dst, list(ctx.sample_texts)[:CHECK_ROWS], tokenizer, ctx.threads)
    return {"search_graph": search, "fusion_route": "onnxscript.rewriter.ort_fusions on encoder.onnx and decoder.onnx",
            "fused_before": _sum(before.values()), "fused_possible": total, "fused_kept": _sum(kept.values()),
            "fused_by_graph": counts, "onnxscript_rewrites": rewrites, "slim": slim, "expected": dict(options.expect),
            "fused_parity": parity, "kept": chosen, "reason": reason,
            "timings_ms": timings}


def _sum(dicts) -> dict[str, int]:
    total: dict[str, int] = {}
    for d in dicts:
        for op, n in d.items():
            total[op] = total.get(op, 0) + n
    return total
