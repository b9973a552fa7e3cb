"""`xformopt bench`: re-measure an artifact and, with --baseline, gate on latency and accuracy."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from xformopt import api
from xformopt.benchmarking import gate
from xformopt.cli import options as opt
from xformopt.cli import output
from xformopt.cli.bench_generation import DECODER_EXAMPLES, ints, print_generation
from xformopt.errors import GateFailed
from xformopt.report.cells import PERCENT_METRICS

EXAMPLES = """
Examples:

    xformopt bench out/                                          # measure; compare with out/report.json (informative)
    xformopt bench out/ --baseline main/report.json              # CI gate: exit 1 on a regression
    xformopt bench out/ --baseline prev-bench.json --max-latency-regression 10% --junit bench.xml -o bench.json
    xformopt bench out/ --json | jq '.artifact.latency.median_ms'

Exit codes: 0 all checks pass (or no --baseline), 1 a regression, 2 bad input or the baseline is
not comparable (other settings, or another host without --allow-host-mismatch).

Latency regression iff new_median > old_median * (1 + limit) + noise, with
noise = 2 * sqrt(old_spread^2 + new_spread^2) and spread = half the range of the repeat medians.
"""


# --------------------------------------------------------------------------- human output


def _metric_text(name: str, metric: dict) -> str:
    value = metric["value"]
    pct = name in PERCENT_METRICS  # as the report shows them: macro_f1 is a 0-1 score, not a percentage
    text = f"{100 * value:.2f}%" if pct else f"{value:.4f}"
    if "ci95" in metric:
        lo, hi = metric["ci95"]
        text += f" (95% CI {100 * lo:.1f}-{100 * hi:.1f}%)" if pct else f" (95% CI {lo:.4f}-{hi:.4f})"
    elif "stderr" in metric:
        text += f" (± {metric['stderr']:.4f} s.e.)"
    return text + f", n={metric.get('n', '?')}"


def measurement_table(doc: dict) -> Table:
    s, lat = doc["settings"], doc["artifact"]["latency"]
    table = Table(
        title=f"bench {doc['artifact_path']} ({doc['artifact']['stage']}, {doc['model'].get('source')} -> {doc['target']})",
        caption=f"batch 1, real held-out lengths, {s['threads']} threads, {s['repeats']} repeats x {s['rounds']} rounds, "
                f"{s['heldout']['rows']} held-out rows",
        show_header=True,
    )
    table.add_column("Measure")
    table.add_column("Value", justify="right")
    table.add_row("latency median", f"{lat['median_ms']:.2f} ms")
    table.add_row("latency p90 / p99", f"{lat['p90_ms']:.2f} / {lat['p99_ms']:.2f} ms")
    table.add_row("repeat medians", " ".join(f"{m:.2f}" for m in lat["repeat_medians_ms"]) + f" ms (spread {lat['spread_ms']:.2f})")
    if "tokens_per_s" in doc["artifact"]:  # encoder-decoders: latency is one sentence, tokenize to decode
        gen = doc["artifact"].get("generation") or {}
        table.add_row("decoded tokens/s", f"{doc['artifact']['tokens_per_s']:.1f} ({gen.get('num_beams', '?')} beam(s), "
                                          f"up to {gen.get('max_new_tokens', '?')} new tokens)")
    for name, metric in doc["artifact"]["metrics"].items():
        table.add_row(name, _metric_text(name, metric))
    return table


def _value(check: dict, key: str) -> str:
    value = check[key]
    if value is None:
        return "-"
    if check["kind"] == "latency":
        return f"{value:.2f} ms"
    return f"{100 * value:.2f}%" if check["name"] in PERCENT_METRICS else f"{value:.4f}"


def comparison_table(comparison: dict) -> Table:
    title = ("gate vs " if comparison["gated"] else "vs (informative, not a gate) ") + str(comparison["baseline"])
    table = Table(title=title, box=box.SIMPLE_HEAD)
    for name in ("Check", "Baseline", "Current", "Change", "Limit", "Tolerance", "Verdict"):
        table.add_column(name, justify="left" if name in ("Check", "Verdict") else "right",
                         no_wrap=name in ("Check", "Baseline", "Current"))
    for c in comparison["checks"]:
        if c["verdict"] == "skipped":
            table.add_row(c["name"], "-", "-", "-", "-", "-", "[yellow]skipped[/yellow]")
            continue
        if c["kind"] == "latency":
            change = f"{c['change']:+.2f} ms {c['change_pct']:+.1f}%"
            limit = f"+{100 * c['limit']:g}%"
            tolerance = f"noise {c['tolerance']:.2f} ms"
        else:
            cosine = gate.points_scale(c["name"]) == 100 and c["name"] not in PERCENT_METRICS  # a 0-1 score
            change = f"{c['change']:+.4f}" if cosine else f"{c['change_points']:+.2f} pt"
            limit = f"-{c['limit'] / 100:g}" if cosine else f"-{c['limit']:g} pt"
            tolerance = "-"
        verdict = "[green]pass[/green]" if c["verdict"] == "pass" else "[bold red]REGRESSION[/bold red]"
        if not comparison["gated"] and c["verdict"] != "pass":
            verdict = "[yellow]worse (not gated)[/yellow]"
        table.add_row(c["name"], _value(c, "baseline"), _value(c, "current"), change, limit, tolerance, verdict)
    return table


def evidence_lines(comparison: dict) -> list[str]:
    lines = []
    for c in comparison["checks"]:
        ev = c["evidence"]
        if c["kind"] == "latency":
            old = " ".join(f"{m:.2f}" for m in ev["baseline_repeat_medians_ms"]) or "n/a"
            new = " ".join(f"{m:.2f}" for m in ev["current_repeat_medians_ms"]) or "n/a"
            lines.append(f"latency evidence: repeat medians baseline [{old}] ms (spread {ev['baseline_spread_ms']:.2f}), "
                         f"current [{new}] ms (spread {ev['current_spread_ms']:.2f}); noise = 2*sqrt("
                         f"{ev['baseline_spread_ms']:.2f}^2 + {ev['current_spread_ms']:.2f}^2) = {c['tolerance']:.2f} ms; "
                         f"regression iff current > {c['baseline']:.2f} * {1 + c['limit']:g} + {c['tolerance']:.2f} = {c['threshold']:.2f} ms")
        elif c["verdict"] == "skipped":
            lines.append(c["message"])
        else:
            def unc(side: dict) -> str:
                if "ci95" in side:
                    return f"95% CI {side['ci95'][0]:.4f}-{side['ci95'][1]:.4f}, n={side.get('n')}"
                if "stderr" in side:
                    return f"s.e. {side['stderr']:.5f}, n={side.get('n')}"
                return f"n={side.get('n')}"
            lines.append(f"{c['name']} evidence: baseline {c['baseline']:.4f} ({unc(ev['baseline'])}), current {c['current']:.4f} "
                         f"({unc(ev['current'])}); regression iff {gate.points_scale(c['name']):g}*(baseline - current) > {c['limit']:g} points, "
                         f"i.e. current < {c['threshold']:.4f}")
    return lines


def print_human(doc: dict) -> None:
    comparison = doc["comparison"]
    # In a CI log (not a terminal) rich assumes 80 columns and would wrap every cell: print the
    # tables 120 wide there (a Console without a file writes to the sys.stdout of the moment).
    console = output.stdout if output.stdout.is_terminal else Console(width=120, soft_wrap=True)
    console.print(measurement_table(doc))
    for note in doc["notes"]:
        output.stdout.print(f"note: {note}", highlight=False, markup=False)
    if not comparison["comparable"]:
        output.stdout.print(f"note: not comparable: {comparison['reason']}", highlight=False, markup=False)
    elif comparison.get("host_mismatch_allowed"):
        diffs = ", ".join(f"{d['field']} {d['baseline']!r} in the baseline vs {d['current']!r} here" for d in comparison["host_mismatch"])
        output.stdout.print(f"note: host differs (allowed by --allow-host-mismatch): {diffs}", highlight=False, markup=False)
    if comparison["checks"]:
        console.print(comparison_table(comparison))
    for line in evidence_lines(comparison):
        output.stdout.print(line, highlight=False, markup=False)
    if comparison["gated"]:
        output.stdout.print("[green]gate passed[/green]" if comparison["passed"] else "[bold red]gate failed[/bold red]")
    else:
        output.stdout.print("informative only: pass --baseline FILE to gate (exit 1 on a regression)", highlight=False)


# --------------------------------------------------------------------------- command


def bench(
    artifact: Annotated[Path, typer.Argument(metavar="DIR", help="The -o folder of `xformopt optimize`, or of a "
        "single-pass command (export, fuse, quantize).")],
    data: Path = typer.Option(None, "--data", metavar="FILE", help="Held-out CSV/TSV/JSONL/datasets dir [default: the data the artifact's report used]."),
    text_column: str = typer.Option(None, "--text-column", help="Text column [default: the recipe's, else guessed]."),
    text_pair_column: opt.TextPairColumn = None,
    label_column: str = typer.Option(None, "--label-column", help="Label column [default: the recipe's, else guessed]."),
    limit: int = typer.Option(None, "--limit", min=1, max=10_000_000, help="At most N held-out rows (seeded sample) [default: the recipe's limit]."),
    seed: int = typer.Option(None, "--seed", min=0, max=2**32 - 1, help="Sampling and timing-order seed [default: the report's]."),
    threads: int = typer.Option(None, "--threads", min=1, help="Intra-op threads [default: the report's]."),
    rounds: int = typer.Option(None, "--rounds", min=3, max=100_000, help="Batch-1 calls per repeat [default: the report's]."),
    warmup: int = typer.Option(None, "--warmup", min=0, max=10_000, help="Untimed calls before the first repeat [default: the report's]."),
    repeats: int = typer.Option(None, "--repeats", min=1, max=1000, help="Timing repeats; their spread is the noise [default: the report's]."),
    as_json: bool = typer.Option(False, "--json", help="Print the bench document (schema xformopt.bench/1) on stdout."),
    baseline: Path = typer.Option(None, "--baseline", metavar="FILE", help="report.json or a previous bench JSON to "
        "gate against; without it nothing is gated."),
    max_latency_regression: str = typer.Option("5%", "--max-latency-regression", help="Allowed median slow-down beyond noise: 5% or 0.05."),
    max_accuracy_drop: opt.MaxAccuracyDrop = "0.5",
    allow_host_mismatch: bool = typer.Option(False, "--allow-host-mismatch", help="Compare with a baseline from another host (settings must still match)."),
    junit: Path = typer.Option(None, "--junit", metavar="FILE", help="Also write the checks as JUnit XML to this file."),
    out: Path = typer.Option(None, "--out", "-o", metavar="FILE", help="Also write the bench document (JSON) to this file, atomically."),
    prompt_tokens: str = typer.Option(None, "--prompt-tokens", help="Decoders: prompt lengths, e.g. 16,64 [default: 16,64]."),
    new_tokens: str = typer.Option(None, "--new-tokens", help="Decoders: tokens generated per run, e.g. 32,128 [default: 32,128]."),
    compare: list[Path] = typer.Option(None, "--compare", metavar="DIR", help="Decoders: also time this ONNX stage directory (repeatable)."),
    cache_only: bool = typer.Option(False, "--cache-only", help="Decoders: skip the runs without the KV cache."),
    no_pytorch: bool = typer.Option(False, "--no-pytorch", help="Decoders: leave the PyTorch baseline out."),
    quiet: opt.Quiet = False,
) -> None:
    """Re-measure an artifact; with --baseline, exit 1 on a latency or accuracy regression.

    ARTIFACT is measured as `optimize` measured it (same rows, solo batch-1 timing in repeats); an
    encoder-decoder's latency is one sentence end to end (tokenize, generate, decode), with decoded tokens/s.

    Only like is compared with like: a baseline with other settings (threads, seed, held-out rows)
    is refused, and one from another host too unless --allow-host-mismatch.
    """

    result = api.bench(
        artifact, baseline=baseline, data=data, text_column=text_column, text_pair_column=text_pair_column,
        label_column=label_column, limit=limit, seed=seed, threads=threads, rounds=rounds, warmup=warmup,
        repeats=repeats, max_latency_regression=max_latency_regression, max_accuracy_drop=max_accuracy_drop,
        allow_host_mismatch=allow_host_mismatch, output=out, junit=junit,
        prompt_tokens=None if prompt_tokens is None else ints(prompt_tokens, "--prompt-tokens"),
        new_tokens=None if new_tokens is None else ints(new_tokens, "--new-tokens"),
        compare=compare or (), cache_only=cache_only, pytorch=not no_pytorch,
    )
    if as_json:
        output.emit_json(result.doc)
    elif result.kind == "generation":
        print_generation(result.doc)
    else:
        print_human(result.doc)
    if result.verdict == "regression":
        raise GateFailed(result.failure)


def register(app: typer.Typer) -> None:

    app.command("bench", help=(bench.__doc__ or "") + EXAMPLES + DECODER_EXAMPLES)(bench)
