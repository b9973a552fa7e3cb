"""How close to the fp32 teacher must embeddings be for the kNN overlap@10 a report gives (issue 53's >= 0.9)?

Reads an embeddings artifact's reference (the fp32 model's embeddings of the report's rows, ``reference/``), then:
- the overlap of the fp32 embeddings with themselves plus isotropic Gaussian noise, at increasing noise: the
  overlap a given mean cosine allows when the error has no structure (the kindest error for neighbour order);
- each artifact given (the teacher's INT8, a student) embedding the same rows: its cosine and overlap, to set
  against that curve;
- how close the 10th and 11th neighbours are (the near-ties a small error reorders).

Run: python benchmarks/embedding_overlap_bound.py ARTIFACT [ARTIFACT ...] --json OUT.json
(the first artifact's reference is the baseline; every artifact must have been scored on the same rows)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

import xformopt  # noqa: F401  (ORT telemetry off before onnxruntime loads)


def noisy_overlaps(baseline: np.ndarray, sigmas: list[float], seeds: int = 3) -> list[dict]:
    from xformopt.scoring.retrieval import _unit, neighbour_overlap

    unit = _unit(baseline)
    rows = []
    for sigma in sigmas:
        cosines, overlaps = [], []
        for seed in range(seeds):
            noisy = unit + np.random.default_rng(seed).standard_normal(unit.shape) * sigma / np.sqrt(unit.shape[1])
            cosines.append(float(np.mean(np.sum(_unit(noisy) * unit, axis=1))))
            overlaps.append(neighbour_overlap(noisy, baseline)["value"])
        rows.append({"sigma": sigma, "cosine": float(np.mean(cosines)), "overlap_at_10": float(np.mean(overlaps))})
    return rows


def near_ties(baseline: np.ndarray) -> dict:
    from xformopt.scoring.retrieval import _unit

    sims = _unit(baseline) @ _unit(baseline).T
    np.fill_diagonal(sims, -np.inf)
    ranked = -np.sort(-sims, axis=1)
    gap = ranked[:, 9] - ranked[:, 10]
    return {"tenth_neighbour_cosine_median": float(np.median(ranked[:, 9])),
            "gap_10th_11th_median": float(np.median(gap)), "gap_10th_11th_p10": float(np.quantile(gap, 0.1)),
            "share_gap_below_0.001": float(np.mean(gap < 0.001)), "share_gap_below_0.005": float(np.mean(gap < 0.005))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifacts", nargs="+", type=Path)
    parser.add_argument("--batch-size", type=int, default=32, help="rows per ONNX Runtime call (INT8 scales per call)")
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    from xformopt.api import load
    from xformopt.measure.host import cpu_model, library_versions
    from xformopt.scoring.retrieval import _unit, neighbour_overlap

    reference = args.artifacts[0] / "reference"
    baseline = np.load(reference / "baseline_outputs.npy")
    rows = json.loads((reference / "rows.json").read_text())
    texts = texts_of(args.artifacts[0], rows)
    result = {"host": cpu_model(), "versions": library_versions(), "rows": rows["source"], "batch_size": args.batch_size,
              "noise": noisy_overlaps(baseline, [0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3]),
              "near_ties": near_ties(baseline), "artifacts": {}}
    for artifact in args.artifacts:
        embeddings = np.asarray(load(artifact).embed(texts, batch_size=args.batch_size), np.float64)
        result["artifacts"][str(artifact)] = {
            "cosine": float(np.mean(np.sum(_unit(embeddings) * _unit(baseline), axis=1))),
            "overlap_at_10": neighbour_overlap(embeddings, baseline)["value"]}
        print(artifact, result["artifacts"][str(artifact)], file=sys.stderr)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


def texts_of(artifact: Path, rows: dict) -> list[str]:
    """The report's rows: its held-out file loaded as optimize loaded it, then the reference's row ids."""
    from xformopt.data import load_text_dataset

    report = json.loads((artifact / "report.json").read_text())
    dataset = load_text_dataset(report["settings"]["heldout"]["path"])
    if dataset.source != rows["source"]:  # other columns or a sample: not the rows the reference holds
        sys.exit(f"{artifact}: the held-out file now reads as {dataset.source!r}, the reference as {rows['source']!r}")
    return [dataset.texts[i] for i in rows["row_ids"]]


if __name__ == "__main__":
    main()
