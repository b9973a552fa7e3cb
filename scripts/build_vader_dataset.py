#!/usr/bin/env python3
"""Build the vendored ``xformopt/resources/vader_movie`` sentiment dataset.

Source: the movie-review snippets with human sentiment ratings shipped in the
vaderSentiment 3.3.2 sdist (MIT, Copyright (c) 2016 C.J. Hutto), file
``additional_resources/hutto_ICWSM_2014.tar.gz`` ->
``hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt``.

Usage::

    pip download --no-deps --no-binary :all: vaderSentiment==3.3.2 -d /tmp/vader
    python scripts/build_vader_dataset.py /tmp/vader/vaderSentiment-3.3.2.tar.gz

The argument may also be an already extracted ``movieReviewSnippets_GroundTruth.txt``
(the sdist's ``LICENSE.txt`` is then looked up in its parent folders, or given with
``--license``). Standard library only; the output is byte-identical for either input.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import random
import sys
import tarfile
from pathlib import Path

SDIST = "vaderSentiment-3.3.2"
INNER_TARBALL = f"{SDIST}/additional_resources/hutto_ICWSM_2014.tar.gz"
GROUND_TRUTH = "hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt"
LICENSE_MEMBER = f"{SDIST}/LICENSE.txt"

SEED = 13
NEUTRAL_BAND = 0.5  # |score| below this is too ambiguous for a binary label
FRACTIONS = {"test": 0.2, "validation": 0.1}  # the remainder (~70%) is train
SPLITS = ("train", "validation", "test")
LABELS = ("negative", "positive")

CITATION = (
    "Hutto, C.J. & Gilbert, E.E. (2014). VADER: A Parsimonious Rule-based Model for "
    "Sentiment Analysis of Social Media Text. Eighth International Conference on "
    "Weblogs and Social Media (ICWSM-14). Ann Arbor, MI, June 2014."
)
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "xformopt" / "resources" / "vader_movie"


def read_sources(src: Path, license_path: Path | None) -> tuple[bytes, bytes]:
    """Return (GroundTruth bytes, LICENSE bytes) from the sdist tarball or an extracted file."""
    if tarfile.is_tarfile(src):
        with tarfile.open(src) as sdist:
            licence = sdist.extractfile(LICENSE_MEMBER).read()
            # The research data is itself a tarball nested inside the sdist.
            inner = io.BytesIO(sdist.extractfile(INNER_TARBALL).read())
        with tarfile.open(fileobj=inner) as resources:
            data = resources.extractfile(GROUND_TRUTH).read()
    else:
        data = src.read_bytes()
        if license_path is None:
            candidates = (p / "LICENSE.txt" for p in src.resolve().parents)
            license_path = next((p for p in candidates if p.is_file()), None)
            if license_path is None:
                sys.exit(f"error: no LICENSE.txt above {src}; pass --license PATH")
        licence = license_path.read_bytes()
    return data, licence


def clean(text: str) -> str:
    # The snippets write double quotes as two single quotes (''Conan'').
    return " ".join(text.replace("''", '"').split())


def parse(data: bytes) -> tuple[list[dict], dict[str, int]]:
    stats = {"raw": 0, "empty": 0, "duplicate": 0, "neutral": 0}
    seen: set[str] = set()
    rows = []
    for line in data.decode("utf-8").splitlines():
        if not line.strip():
            continue
        stats["raw"] += 1
        id_, score, text = line.split("\t", 2)
        text = clean(text)
        if not text:
            stats["empty"] += 1
            continue
        key = text.casefold()  # already whitespace-normalised by clean()
        if key in seen:
            stats["duplicate"] += 1
            continue
        seen.add(key)
        score = float(score)
        if abs(score) < NEUTRAL_BAND:
            stats["neutral"] += 1
            continue
        label = "positive" if score > 0 else "negative"
        rows.append({"text": text, "label": label, "score": round(score, 4), "id": int(id_)})
    return rows, stats


def split(rows: list[dict]) -> dict[str, list[dict]]:
    """Stratified, seeded split; each split is sorted by id so rebuilds diff cleanly."""
    # By hand, not sklearn's train_test_split: this exact procedure made the vendored files, and the
    # README promises a rebuild reproduces them byte for byte.
    rng = random.Random(SEED)
    out: dict[str, list[dict]] = {name: [] for name in SPLITS}
    for label in LABELS:
        group = sorted((r for r in rows if r["label"] == label), key=lambda r: r["id"])
        rng.shuffle(group)
        n_test = round(len(group) * FRACTIONS["test"])
        n_val = round(len(group) * FRACTIONS["validation"])
        out["test"] += group[:n_test]
        out["validation"] += group[n_test : n_test + n_val]
        out["train"] += group[n_test + n_val :]
    for name in SPLITS:
        out[name].sort(key=lambda r: r["id"])
    return out


def readme(splits: dict[str, list[dict]], stats: dict[str, int], sha256: str) -> str:
    table = ["| split | rows | negative | positive | positive share |", "|---|---:|---:|---:|---:|"]
    for name in SPLITS:
        rows = splits[name]
        pos = sum(r["label"] == "positive" for r in rows)
        table.append(f"| {name} | {len(rows)} | {len(rows) - pos} | {pos} | {pos / len(rows):.1%} |")
    total = sum(len(v) for v in splits.values())
    return f"""# vader_movie: binary movie-review sentiment

{total} English movie-review snippets labelled `negative` / `positive`, derived from the
human-rated snippets that C.J. Hutto and E. Gilbert published with VADER.

## Source

- Package: `{SDIST}` sdist on PyPI (`pip download --no-deps --no-binary :all: vaderSentiment==3.3.2`)
- File: `{INNER_TARBALL}` -> `{GROUND_TRUTH}`
  (sha256 `{sha256}`), lines `id<TAB>mean_score<TAB>text`, where `mean_score` is the mean of
  at least 20 independent human ratings on a -4 (extremely negative) .. +4 (extremely positive)
  scale. Per the dataset's `_README_.txt`, the snippets are sentences of the 2,000 movie
  reviews of Pang & Lee (2004), split with the NLTK tokenizer.
- Licence: MIT, Copyright (c) 2016 C.J. Hutto; `LICENSE` here is the sdist's `LICENSE.txt` verbatim.
- Citation: {CITATION}

## Cleaning (`scripts/build_vader_dataset.py`)

1. Read {stats['raw']} lines (UTF-8, CRLF).
2. Replace the `''` (two single quotes) artefact with `"`, collapse every run of whitespace
   to one space, strip; drop empty texts ({stats['empty']} dropped).
3. Deduplicate on the case-folded, whitespace-normalised text, keeping the first occurrence
   in file order ({stats['duplicate']} dropped).
4. Drop near-neutral snippets with |mean_score| < {NEUTRAL_BAND} ({stats['neutral']} dropped);
   label the rest `positive` (score > 0) or `negative` (score < 0).
5. Split stratified by label with `random.Random({SEED})`: per label, sort by id, shuffle,
   take 20% test, 10% validation, the rest train. Splits are disjoint; rows in each file are
   sorted by id.

Nothing else is changed (no case folding, no Unicode normalisation in the stored text).

## Files

`train.jsonl`, `validation.jsonl`, `test.jsonl`: one JSON object per line with
`text` (str), `label` (`"negative"` or `"positive"`), `score` (float, mean rating rounded to
4 places) and `id` (int, the original line id).

{chr(10).join(table)}

## Rebuild

```
pip download --no-deps --no-binary :all: vaderSentiment==3.3.2 -d /tmp/vader
python scripts/build_vader_dataset.py /tmp/vader/vaderSentiment-3.3.2.tar.gz
```
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", type=Path, help=f"{SDIST}.tar.gz or an extracted movieReviewSnippets_GroundTruth.txt")
    ap.add_argument("--license", type=Path, help="the sdist's LICENSE.txt (only when SOURCE is the extracted file)")
    ap.add_argument("--out-dir", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)

    data, licence = read_sources(args.source, args.license)
    rows, stats = parse(data)
    splits = split(rows)

    ids = [r["id"] for rows_ in splits.values() for r in rows_]
    assert len(ids) == len(set(ids)) == len(rows), "splits must be disjoint and complete"

    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name in SPLITS:
        with open(args.out_dir / f"{name}.jsonl", "w", encoding="utf-8", newline="\n") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in splits[name])
    (args.out_dir / "LICENSE").write_bytes(licence)
    sha256 = hashlib.sha256(data).hexdigest()
    (args.out_dir / "README.md").write_text(readme(splits, stats, sha256), encoding="utf-8", newline="\n")

    print(f"{stats} kept={len(rows)} -> " + ", ".join(f"{k}={len(v)}" for k, v in splits.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
