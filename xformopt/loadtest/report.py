"""A load ladder's numbers, as JSON, markdown and a plot (latency percentiles against offered rate,
the knee marked: the highest rate whose p99 stays under the bound with no errors)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np

from xformopt.plot_style import PALETTE, figure

SCHEMA = "xformopt.loadtest/1"
LAG_LIMIT_MS = 10.0  # a p99 client lag above this: the client set the pace, not the server


def summarize(outcomes, rate: float, duration: float, batch: float | None) -> dict:
    """One step: offered and achieved rate, latency percentiles (ms, from the scheduled send time),
    errors by status, the server's mean batch size over the step, the client's own lag."""
    ok = [o for o in outcomes if o.status == "200"]
    latency = np.array([(o.done - o.scheduled) * 1000 for o in outcomes]) if outcomes else np.zeros(1)
    lag = np.array([(o.started - o.scheduled) * 1000 for o in outcomes]) if outcomes else np.zeros(1)
    span = (max(o.done for o in outcomes) - min(o.scheduled for o in outcomes)) if outcomes else duration
    errors = dict(sorted(Counter(o.status for o in outcomes if o.status != "200").items()))
    pct = {f"p{q}_ms": round(float(np.percentile(latency, q)), 3) for q in (50, 90, 99)}
    return {"offered_rps": rate, "sent": len(outcomes), "sent_rps": round(len(outcomes) / duration, 2),
            "achieved_rps": round(len(ok) / max(span, 1e-9), 2), "ok": len(ok), "errors": errors, **pct,
            "max_ms": round(float(latency.max()), 3), "mean_batch_size": None if batch is None else round(batch, 2),
            "client_lag_p99_ms": round(float(np.percentile(lag, 99)), 3),
            "client_bound": bool(np.percentile(lag, 99) > LAG_LIMIT_MS)}


def sustainable(steps: list[dict], p99_ms: float) -> float | None:
    """The highest offered rate whose p99 is within ``p99_ms`` with no errors (None: no such step)."""
    good = [s["offered_rps"] for s in steps if s["p99_ms"] <= p99_ms and not s["errors"] and s["sent"]]
    return max(good) if good else None


def markdown(document: dict) -> str:
    settings = document["settings"]
    lines = [f"# Load test ({settings['duration_s']:g} s per rate, p99 bound {settings['p99_ms']:g} ms)", ""]
    host = document.get("host", {})
    lines.append(f"Host: {host.get('cpu', '?')}, {host.get('usable_cpus', '?')} usable CPUs; load average "
                 f"{document.get('load_average', {}).get('before')} before, "
                 f"{document.get('load_average', {}).get('after')} after.")
    lines.append("")
    for target in document["targets"]:
        best = target["sustainable_rps"]
        lines += [f"## {target['label']} ({target['url']})", "",
                  f"Highest rate with p99 ≤ {settings['p99_ms']:g} ms and no errors: "
                  f"**{best if best is not None else 'none'}** req/s", "",
                  "| offered req/s | achieved | p50 ms | p90 ms | p99 ms | max ms | errors | mean batch | client lag p99 ms |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for s in target["steps"]:
            errors = ", ".join(f"{k}: {v}" for k, v in s["errors"].items()) or "0"
            lag = f"{s['client_lag_p99_ms']:g}" + (" (client-bound)" if s["client_bound"] else "")
            lines.append(f"| {s['offered_rps']:g} | {s['achieved_rps']:g} | {s['p50_ms']:g} | {s['p90_ms']:g} | "
                         f"{s['p99_ms']:g} | {s['max_ms']:g} | {errors} | {s['mean_batch_size'] if s['mean_batch_size'] is not None else '-'} | {lag} |")
        lines.append("")
        if target.get("overload"):
            lines += overload_lines(target["overload"])
    if document.get("comparison"):
        c = document["comparison"]
        lines.append(f"Sustainable rate ratio {c['labels'][0]} / {c['labels'][1]}: "
                     f"**{c['ratio'] if c['ratio'] is not None else 'n/a'}**")
        lines.append("")
    for warning in document.get("warnings", []):
        lines.append(f"> {warning}")
    return "\n".join(lines).rstrip() + "\n"


def overload_lines(o: dict) -> list[str]:
    memory, checks = o["memory"], o.get("checks", {})

    def mb(value):
        return f"{value / 2**20:.0f} MB" if value else "?"

    statuses = ", ".join(f"{k}: {v}" for k, v in o["overload"]["by_status"].items())
    back = ", ".join(f"{k}: {v}" for k, v in o["recovery"]["by_status"].items())
    return [f"### Overload: {o['over_rps']:g} req/s for {o['over_s']:g} s, then {o['full_rps']:g} req/s for "
            f"{o['recovery_s_run']:g} s", "",
            f"- during the overload: {o['overload']['sent']} sent ({statuses}); 200s at "
            f"{o['overload']['achieved_200_rps']:g} req/s",
            f"- after it: {o['recovery']['sent']} sent ({back}); back to all-200 with median <= {o['p99_ms']:g} ms "
            f"after **{o['recovery']['recovered_after_s']} s** (every one-second window's p99 too: after "
            f"{o['recovery'].get('p99_recovered_after_s')} s)",
            f"- lost (connection failed or reset): **{o['lost']}**; hung (no answer within the client's timeout): "
            f"**{o['hung']}**",
            f"- server memory: idle {mb(memory['idle_bytes'])}, peak {mb(memory['peak_bytes'])} "
            f"(**{memory['peak_over_idle']}x** idle; {len(memory['samples'])} samples)",
            f"- client send lag p99 {o['client_lag_p99_ms']:g} ms",
            "- checks: " + ", ".join(f"{k} {'yes' if v else ('n/a' if v is None else 'NO')}" for k, v in checks.items()),
            ""]


def plot(document: dict, path: Path) -> Path:

    fig = figure()
    ax = fig.add_subplot()
    bound = document["settings"]["p99_ms"]
    for color, target in zip(PALETTE, document["targets"]):
        rates = [s["offered_rps"] for s in target["steps"]]
        for q, style in (("p50", ":"), ("p90", "--"), ("p99", "-")):
            ax.plot(rates, [s[f"{q}_ms"] for s in target["steps"]], style, color=color, marker="o", markersize=3,
                    label=f"{target['label']} {q}")
        knee = target["sustainable_rps"]
        if knee is not None:
            ax.axvline(knee, color=color, alpha=0.4, linewidth=1)
            ax.annotate(f"knee {knee:g}/s", (knee, bound), textcoords="offset points", xytext=(4, 6), color=color)
    ax.axhline(bound, color="#888888", linewidth=1, linestyle="-.", label=f"p99 bound {bound:g} ms")
    ax.set_xlabel("offered rate (requests/s, Poisson arrivals)")
    ax.set_ylabel("latency (ms, from scheduled send)")
    ax.set_yscale("log")
    ax.set_title("Latency percentiles against offered load")
    ax.legend()
    fig.savefig(path)
    return path
