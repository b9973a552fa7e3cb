"""`xformopt loadtest TARGET`: open-loop load at a ladder of rates; p50/p90/p99 per rate and the
highest rate that keeps p99 under a bound."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Annotated

import typer

from xformopt import atomic
from xformopt.cli import options as opt
from xformopt.cli import output
from xformopt.data import load_text_dataset
from xformopt.errors import InputError
from xformopt.loadtest import report, stream_report
from xformopt.loadtest.run import Options, run
from xformopt.loadtest.stream_ladder import StreamOptions, run_streams, serves_text_generation
from xformopt.loadtest.targets import open_targets
from xformopt.resources import vader_split_path

EXAMPLES = """
Examples:

    xformopt loadtest http://127.0.0.1:8080 --rates 10,20,40,80 --duration 10 -o lt/
    xformopt loadtest out/ --rates 20,40,80,160 --p99-ms 50          # starts `xformopt serve out/` itself
    xformopt loadtest out/ --rates 100,200,400 --overload 2          # then 2x the sustainable rate for 60 s
    xformopt loadtest out/ --serve-args "--max-batch 1" --compare http://127.0.0.1:7997 \\
        --compare-route /classify --compare-field input --compare-as-list

    xformopt loadtest smol-int4/ --streams 1,2,4,8 --max-tokens 128 -o lt/   # a decoder: streams

Latency is measured from each request's scheduled (Poisson) send time, so a slow server cannot hide
its latency by slowing the client. A decoder server (its /info says text-generation, or --route is a
completions route) gets a closed-loop ladder of concurrent streams instead of rates: time to first
token, inter-token latency, tokens/s per stream and together. Writes loadtest.json, loadtest.md and
loadtest.png to -o DIR.
"""


def _rates(value: str) -> list[float]:
    try:
        rates = [float(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"{value!r}: give comma-separated requests per second, e.g. 5,10,20") from None
    if not rates or any(r <= 0 for r in rates):
        raise typer.BadParameter(f"{value!r}: give positive rates, e.g. 5,10,20")
    return sorted(rates)


def register(app: typer.Typer) -> None:
    @app.command(epilog=EXAMPLES)
    def loadtest(
        target: Annotated[str, typer.Argument(metavar="TARGET", help="A server URL, or an artifact directory (served on a free local port for the run).")],
        rates: Annotated[str, typer.Option("--rates", help="Offered rates, requests/s, comma-separated.")] = "5,10,20,40,80,160",
        duration: Annotated[float, typer.Option("--duration", min=0.5, help="Seconds per rate (per stream count "
            "for decoders) [default: 10, decoders 30].")] = None,
        warmup: Annotated[float, typer.Option("--warmup", min=0, help="Seconds of warm-up at the first rate (not reported).")] = 3.0,
        p99_ms: Annotated[float, typer.Option("--p99-ms", min=0.1, help="The p99 bound the sustainable rate keeps.")] = 50.0,
        data: Annotated[Path, typer.Option("--data", metavar="FILE", help="Texts to send (any format --data takes "
            "elsewhere) [default: vendored VADER test split].")] = None,
        concurrency_limit: Annotated[int, typer.Option("--concurrency-limit", min=1, help="Requests in flight at most (waiting counts as latency).")] = None,
        out: Annotated[Path, typer.Option("--out", "-o", metavar="DIR", help="Write loadtest.json, loadtest.md, loadtest.png here.")] = None,
        compare: Annotated[str, typer.Option("--compare", metavar="URL2", help="A second server (URL or artifact), "
            "run in the same interleaved ladder.")] = None,
        serve_args: Annotated[str, typer.Option("--serve-args", help="Options for `xformopt serve` when TARGET is an artifact, e.g. '--max-batch 1'.")] = "",
        compare_serve_args: Annotated[str, typer.Option("--compare-serve-args", help="Options for `xformopt serve` "
            "when --compare is an artifact.")] = "",
        route: Annotated[str, typer.Option("--route", help="Path to POST to [default: from the server's /info].")] = None,
        field_name: Annotated[str, typer.Option("--field", help="JSON field holding the text [default: from /info].")] = None,
        compare_route: Annotated[str, typer.Option("--compare-route", help="--route for the --compare server.")] = None,
        compare_field: Annotated[str, typer.Option("--compare-field", help="--field for the --compare server.")] = None,
        compare_as_list: Annotated[bool, typer.Option("--compare-as-list", help="Send the --compare server each text as a one-element list.")] = False,
        model: Annotated[str, typer.Option("--model", help="A 'model' field to send (servers that require one).")] = None,
        api_key_env: Annotated[str, typer.Option("--api-key-env", metavar="VAR", help="Send Authorization: Bearer $VAR.")] = None,
        full_ladder: Annotated[bool, typer.Option("--full-ladder", help="Run every rate, also past the knee.")] = False,
        overload_factor: Annotated[float, typer.Option("--overload", metavar="FACTOR", min=1.0, help="After the ladder, "
            "send FACTOR x the sustainable rate for --overload-duration, then the sustainable rate: reports requests "
            "lost or hung, the server's memory over time against idle, and the time to recover.")] = None,
        overload_rps: Annotated[float, typer.Option("--overload-rate", metavar="RPS", min=0.1, help="Like --overload, "
            "at this rate.")] = None,
        overload_s: Annotated[float, typer.Option("--overload-duration", min=1.0, help="Seconds of overload.")] = 60.0,
        recovery_s: Annotated[float, typer.Option("--recovery-duration", min=2.0, help="Seconds at the sustainable "
            "rate after the overload.")] = 15.0,
        seed: Annotated[int, typer.Option("--seed", help="Seed of the arrival times and text order.")] = 0,
        limit: Annotated[int, typer.Option("--limit", min=1, help="Texts to cycle through at most.")] = 2000,
        streams: Annotated[str, typer.Option("--streams", help="Decoders: concurrent streams per level, "
            "comma-separated.")] = "1,2,4,8",
        max_tokens: Annotated[int, typer.Option("--max-tokens", min=1, help="Decoders: new tokens per request.")] = 128,
        prompt_chars: Annotated[int, typer.Option("--prompt-chars", min=1, help="Decoders: prompt length in "
            "characters of real text (~4.5 per token in English).")] = 600,
        stop_at_eos: Annotated[bool, typer.Option("--stop-at-eos", help="Decoders: let requests end at EOS "
            "(default: ignore_eos, so every request decodes --max-tokens).")] = False,
        json_out: opt.Json = False,
        quiet: opt.Quiet = False,
    ) -> None:
        """Open-loop load test: latency percentiles per offered rate, and the highest rate under --p99-ms."""

        ladder = _rates(rates)
        levels = _streams(streams)
        key = None
        if api_key_env:
            key = os.environ.get(api_key_env) or None
            if key is None:
                raise InputError(f"--api-key-env {api_key_env}: that environment variable is unset or empty")
        texts = _texts(data, limit, seed)
        options = Options(rates=ladder, duration_s=duration or 10.0, warmup_s=warmup, p99_ms=p99_ms,
                          concurrency_limit=concurrency_limit, seed=seed, route=route, field_name=field_name,
                          model=model, api_key=key, full_ladder=full_ladder, overload_factor=overload_factor,
                          overload_rps=overload_rps, overload_s=overload_s, recovery_s=recovery_s)
        with contextlib.ExitStack() as stack:
            specs = [(target, "target", serve_args), (compare, "compare", compare_serve_args)]
            targets = open_targets(stack, [s for s in specs if s[0] is not None])
            if len(targets) == 2:
                targets[1].route, targets[1].field_name = compare_route, compare_field
                targets[1].as_list = compare_as_list
            decoder = serves_text_generation(targets[0].url, route, key)
            if decoder:
                stream_options = StreamOptions(levels, duration or 30.0, warmup, max_tokens, prompt_chars,
                                               not stop_at_eos, route=route, model=model, api_key=key, seed=seed)
                document = run_streams(targets, [t if isinstance(t, str) else t["context"] for t in texts],
                                       stream_options)
            else:
                document = run(targets, texts, options)
        _deliver(document, stream_report if decoder else report, out, json_out)


def _deliver(document: dict, render, out: Path | None, json_out: bool) -> None:
    """Warnings on stderr; the document, its table and plot in ``out``; the table (or JSON) on stdout."""
    for warning in document["warnings"]:
        output.log(f"warning: {warning}")
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        atomic.write_json(out / "loadtest.json", document)
        atomic.write_text(out / "loadtest.md", render.markdown(document))
        render.plot(document, out / "loadtest.png")
        output.log(f"wrote {out / 'loadtest.json'}, loadtest.md, loadtest.png")
    if json_out:
        output.emit_json(document)
    else:
        output.stdout.print(render.markdown(document), highlight=False, markup=False)


def _streams(value: str) -> list[int]:
    try:
        levels = [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"{value!r}: give comma-separated stream counts, e.g. 1,2,4,8") from None
    if not levels or any(n < 1 for n in levels):
        raise typer.BadParameter(f"{value!r}: give stream counts of at least 1, e.g. 1,2,4,8")
    return sorted(set(levels))


def _texts(data: Path | None, limit: int, seed: int) -> list:

    rows = load_text_dataset(data or vader_split_path("test"), require_labels=False, limit=limit, seed=seed)
    if rows.text_pairs is not None and data is not None:
        return [{"question": q, "context": c} for q, c in zip(rows.texts, rows.text_pairs)]
    return list(rows.texts)
