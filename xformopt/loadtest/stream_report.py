"""A stream ladder's numbers as markdown and a plot: inter-token latency percentiles and aggregate
tokens/s against the number of concurrent streams."""

from __future__ import annotations

from pathlib import Path

from xformopt.plot_style import PALETTE, figure


def _v(value) -> str:
    return "-" if value is None else f"{value:g}"


def markdown(document: dict) -> str:
    settings = document["settings"]
    host = document.get("host", {})
    load = document.get("load_average", {})
    lines = [f"# Decoder load test ({settings['duration_s']:g} s per level, {settings['max_tokens']} new tokens per "
             f"request, prompts of ~{settings['prompt_chars']} characters, {settings['decoding']})", "",
             f"Host: {host.get('cpu', '?')}, {host.get('usable_cpus', '?')} usable CPUs; load average "
             f"{load.get('before')} before, {load.get('after')} after. Arrivals: {settings['arrivals']}.", ""]
    for target in document["targets"]:
        lines += [f"## {target['label']} ({target['route']})", "",
                  "| streams | requests | prompt tok | TTFT p50 / p90 / p99 ms | ITL p50 / p90 / p99 ms | "
                  "per-stream decode tok/s | aggregate decode tok/s | output tok/s | mean decode batch | "
                  "server decode tok/s | errors |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for s in target["levels"]:
            errors = ", ".join(f"{k}: {v}" for k, v in s["errors"].items()) or "0"
            lines.append(f"| {s['streams']} | {s['ok']} | {_v(s['prompt_tokens_mean'])} | {_v(s['ttft_p50_ms'])} / "
                         f"{_v(s['ttft_p90_ms'])} / {_v(s['ttft_p99_ms'])} | {_v(s['itl_p50_ms'])} / "
                         f"{_v(s['itl_p90_ms'])} / {_v(s['itl_p99_ms'])} | {_v(s['stream_decode_tokens_per_s'])} | "
                         f"{_v(s['aggregate_decode_tokens_per_s'])} | {_v(s['output_tokens_per_s'])} | "
                         f"{_v(s['mean_decode_batch'])} | {_v(s.get('server_decode_tokens_per_s'))} | {errors} |")
        ratios = target.get("scaling", {})
        decode = ratios.get("aggregate_decode_tokens_per_s") or {}
        output = ratios.get("output_tokens_per_s") or {}
        inside = ratios.get("server_decode_tokens_per_s") or {}
        if any(v is not None for v in decode.values()):
            parts = [("aggregate decode", decode), ("output", output), ("server decode", inside)]
            lines += ["", "Over one stream: " + "; ".join(
                name + " " + ", ".join(f"{k} streams {_v(v)}x" for k, v in values.items())
                for name, values in parts if any(v is not None for v in values.values())) + "."]
        lines.append("")
    lines.append("TTFT: send to the first chunk with text. ITL: gaps between a stream's text chunks. Per-stream "
                 "decode: tokens after the first over first-to-last token time; aggregate decode: streams x that. "
                 "Output: all completion tokens over the level's wall time (prompt reading included). Server decode "
                 "(xformopt servers, from /metrics): tokens over the seconds spent inside decode calls, prompt "
                 "reading excluded (llama.cpp's S_TG).")
    for warning in document.get("warnings", []):
        lines += ["", f"> {warning}"]
    return "\n".join(lines).rstrip() + "\n"


def plot(document: dict, path: Path) -> Path:
    fig = figure()
    fig.set_size_inches(10.0, 4.5)
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for color, target in zip(PALETTE, document["targets"]):
        levels = [s for s in target["levels"] if s["itl_p50_ms"] is not None]
        streams = [s["streams"] for s in levels]
        for q, style in (("p50", ":"), ("p90", "--"), ("p99", "-")):
            left.plot(streams, [s[f"itl_{q}_ms"] for s in levels], style, color=color, marker="o", markersize=3,
                      label=f"{target['label']} ITL {q}")
        right.plot(streams, [s["aggregate_decode_tokens_per_s"] for s in levels], "-", color=color, marker="o",
                   markersize=3, label=f"{target['label']} aggregate decode")
        right.plot(streams, [s["output_tokens_per_s"] for s in levels], "--", color=color, marker="s", markersize=3,
                   label=f"{target['label']} output (incl. prompts)")
    left.set_xlabel("concurrent streams")
    left.set_ylabel("inter-token latency (ms)")
    left.set_title("Inter-token latency")
    right.set_xlabel("concurrent streams")
    right.set_ylabel("tokens/s")
    right.set_title("Throughput")
    for ax in (left, right):
        ax.legend()
    fig.savefig(path)
    return path
