"""The Pareto front of (metric: higher is better, latency: lower is better).

Written out rather than taken from Optuna: Optuna's front is over the values it was told (the
noisy parallel latencies), and the search must recompute it over re-measured latencies too.
"""

from __future__ import annotations


def dominates(a: dict, b: dict) -> bool:
    return (a["metric"] >= b["metric"] and a["latency_ms"] <= b["latency_ms"]
            and (a["metric"] > b["metric"] or a["latency_ms"] < b["latency_ms"]))


def pareto(points: list[dict]) -> list[dict]:
    """Non-dominated points, fastest first; of identical points the first is kept."""
    front = []
    for p in points:
        if any(dominates(q, p) for q in points):
            continue
        if any(q["metric"] == p["metric"] and q["latency_ms"] == p["latency_ms"] for q in front):
            continue
        front.append(p)
    return sorted(front, key=lambda p: p["latency_ms"])


def layers(points: list[dict], count: int) -> list[dict]:
    """The front and the next COUNT-1 fronts behind it, front by front: the candidates worth
    re-measuring, since a point behind the parallel-measured front may be on it once latencies are
    measured quietly."""
    rest, chosen = list(points), []
    for _ in range(count):
        if not rest:
            break
        front = [p for p in rest if not any(dominates(q, p) for q in rest)]
        chosen.extend(front)
        rest = [p for p in rest if p not in front]
    return chosen
