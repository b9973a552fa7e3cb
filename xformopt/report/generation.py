"""The generation bench document (:mod:`xformopt.decoder.bench`) as a table, for the report, the
terminal and the benchmark scripts: rendering lives with the reports, the measuring with the decoder."""

from __future__ import annotations


def rows(doc: dict) -> tuple[list[str], list[list[str]]]:
    """A flat table of a bench document: one row per cell x runner x cache mode (times in ms)."""
    header = ["Prompt", "New", "Stage", "KV", "TTFT", "Per token p50/p90/p99", "Tok/s", "Total", "KV gain",
              "MB/token", "GB/s"]
    body = []

    def ms(value: float) -> str:
        return f"{value:.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"

    for cell in doc["cells"]:
        for name, modes in cell["results"].items():
            for mode, s in modes.items():
                pt = s["per_token"]
                per_token = "-" if pt["n"] == 0 else "/".join(ms(pt[k]) for k in ("p50_ms", "p90_ms", "p99_ms"))
                speedup = cell["cache_speedup"].get(name)
                step = s.get("bytes_per_token")
                body.append([str(cell["prompt_tokens"]), str(cell["new_tokens"]), name, "yes" if mode == "cache" else "no",
                             ms(s["ttft_ms"]), per_token, f"{s['tokens_per_s']:.0f}", ms(s["total_ms"]),
                             f"{speedup:.1f}x" if speedup and mode == "cache" else "",
                             f"{step / 1e6:.1f}" if step else "", f"{s['gb_per_s']:.1f}" if s.get("gb_per_s") else ""])
    return header, body
