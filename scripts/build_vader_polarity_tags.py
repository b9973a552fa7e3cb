#!/usr/bin/env python3
"""Build the vendored ``xformopt/resources/vader_polarity_tags`` word-level tagging dataset.

Words of the human-rated VADER movie-review snippets, each tagged ``B-POS`` / ``B-NEG`` / ``O`` by a
lowercase lookup in VADER's human-rated lexicon. Both come from the vaderSentiment 3.3.2 sdist (MIT,
Copyright (c) 2016 C.J. Hutto): ``vaderSentiment/vader_lexicon.txt`` and
``additional_resources/hutto_ICWSM_2014.tar.gz`` -> ``movieReviewSnippets_GroundTruth.txt``.

Usage::

    pip download --no-deps --no-binary :all: vaderSentiment==3.3.2 -d /tmp/vader
    python scripts/build_vader_polarity_tags.py /tmp/vader/vaderSentiment-3.3.2.tar.gz

Standard library only; the output is deterministic. The snippets are cleaned and split exactly as
``scripts/build_vader_dataset.py`` does for ``vader_movie`` (reused, not copied), so a sentence is in
the same split in both vendored sets and neither set's test rows are the other's training rows.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import sys
import tarfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import build_vader_dataset as movie  # the snippet cleaning and the split of vader_movie

LEXICON_MEMBER = f"{movie.SDIST}/vaderSentiment/vader_lexicon.txt"
SEED = 29
# Sentences kept per split: a random sample of vader_movie's split (small enough to vendor, and a
# test set large enough for a tight F1 interval).
SIZES = {"train": 3000, "validation": 500, "test": 1000}
MAX_WORDS = 40  # longer snippets (~3%) may not fit 64 WordPiece tokens; dropped rather than cut
THRESHOLD = 1.0  # |mean valence| >= 1.0 on the -4..+4 scale: clearly, not faintly, polar
TAGS = ("O", "B-POS", "B-NEG")
# A word: letters/digits/underscore, with inner apostrophes or hyphens ("doesn't", "well-made");
# anything else that is not space is one token per run ("...", ":)", '".').
WORD = re.compile(r"\w+(?:['\u2019-]\w+)*|[^\w\s]+")
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "xformopt" / "resources" / "vader_polarity_tags"


def read_sources(sdist: Path) -> tuple[bytes, bytes, bytes]:
    """(GroundTruth, lexicon, LICENSE) bytes from the sdist tarball."""
    data, licence = movie.read_sources(sdist, None)
    with tarfile.open(sdist) as tar:
        lexicon = tar.extractfile(LEXICON_MEMBER).read()
    return data, lexicon, licence


def parse_lexicon(lexicon: bytes) -> dict[str, float]:
    """Lowercased token -> mean valence. Lines are ``token<TAB>mean<TAB>std<TAB>[10 ratings]``; a
    later line wins, as in vaderSentiment's own make_lex_dict (it matters only for a few emoticons
    that differ in case, e.g. ``:d``/``:D``, and the repeated ``lol``, ``ok``, ``fav``...)."""
    out: dict[str, float] = {}
    for line in lexicon.decode("utf-8").splitlines():
        if line.strip():
            token, mean = line.split("\t")[:2]
            out[token.lower()] = float(mean)
    return out


def tag(word: str, lexicon: dict[str, float]) -> str:
    valence = lexicon.get(word.lower())
    if valence is None or abs(valence) < THRESHOLD:
        return "O"
    return "B-POS" if valence > 0 else "B-NEG"


def build(data: bytes, lexicon: dict[str, float]) -> tuple[dict[str, list[dict]], dict]:
    rows, _ = movie.parse(data)
    splits = movie.split(rows)
    rng = random.Random(SEED)
    out: dict[str, list[dict]] = {}
    stats = {"long": {}}
    for name in movie.SPLITS:
        sentences = []
        for row in splits[name]:
            words = WORD.findall(row["text"])
            if words and len(words) <= MAX_WORDS:
                sentences.append({"tokens": words, "tags": [tag(w, lexicon) for w in words], "id": row["id"]})
        stats["long"][name] = len(splits[name]) - len(sentences)
        keep = sorted(rng.sample(range(len(sentences)), min(SIZES[name], len(sentences))))
        out[name] = [sentences[i] for i in keep]  # already in id order
    return out, stats


def readme(splits, stats, hashes: dict[str, str], lexicon: dict[str, float]) -> str:
    polar = sum(abs(v) >= THRESHOLD for v in lexicon.values())
    table = ["| split | sentences | words | B-POS | B-NEG | O | sentences with no polar word |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name in movie.SPLITS:
        counts = Counter(t for r in splits[name] for t in r["tags"])
        empty = sum(all(t == "O" for t in r["tags"]) for r in splits[name])
        table.append(f"| {name} | {len(splits[name])} | {sum(counts.values())} | {counts['B-POS']} | "
                     f"{counts['B-NEG']} | {counts['O']} | {empty} |")
    top = {t: Counter(w.lower() for r in splits["train"] for w, g in zip(r["tokens"], r["tags"]) if g == t)
           for t in ("B-POS", "B-NEG")}
    common = {t: ", ".join(f"{w} ({n})" for w, n in c.most_common(10)) for t, c in top.items()}
    long_ = ", ".join(f"{k} {v}" for k, v in stats["long"].items())
    return f"""# vader_polarity_tags: word-level sentiment-polarity tags

{sum(len(v) for v in splits.values())} English movie-review sentences, one tag per word:
`B-POS` / `B-NEG` for a word that VADER's human-rated lexicon rates at least {THRESHOLD:+.1f} / at most
{-THRESHOLD:+.1f} (mean valence), `O` for every other word. A token-classification set built from
real text and human ratings, small enough to ship and use offline.

**What the labels are.** Every tag is a context-free *lookup* of the lowercased word in the lexicon;
nobody annotated spans in these sentences. A word's rating is the mean of 10 human raters who judged
the word on its own (-4 extremely negative .. +4 extremely positive), so the tags are human-made in
that sense only. Consequences: negation and context are ignored (`not good` -> `O B-POS`; `like` in
"like a dream" is `B-POS`; `kind` in "kind of" is `B-POS`; genre words are rated too: `comedy`
`B-POS`, `horror` and `war` `B-NEG`), and a word missing from the lexicon is `O`
however polar it reads (`masterpiece` is in, many inflected forms are not). A model trained on this
learns the lexicon and has to carry it over to other casings and to the sub-word pieces of its
tokenizer; entity F1 measures agreement with the lookup, not sentiment understanding. Each entity is
one word (there are no `I-` tags).

## Source

- Package: `{movie.SDIST}` sdist on PyPI (`pip download --no-deps --no-binary :all: vaderSentiment==3.3.2`)
- Lexicon: `{LEXICON_MEMBER}` (sha256 `{hashes['lexicon']}`), {len(lexicon)} distinct lowercased
  tokens (words, slang, emoticons), {polar} of them with |mean| >= {THRESHOLD}; lines
  `token<TAB>mean<TAB>std<TAB>[10 ratings]`.
- Sentences: `{movie.INNER_TARBALL}` -> `{movie.GROUND_TRUTH}`
  (sha256 `{hashes['sentences']}`): sentences of the movie reviews of Pang & Lee (2004), as
  vendored in `xformopt/resources/vader_movie` (their sentence-level ratings are not used here).
- Licence: MIT, Copyright (c) 2016 C.J. Hutto; `LICENSE` here is the sdist's `LICENSE.txt` verbatim.
- Citation: {movie.CITATION}

## Construction (`scripts/build_vader_polarity_tags.py`)

1. Clean, deduplicate and split the snippets exactly as `scripts/build_vader_dataset.py` does for
   `vader_movie` (its code is imported, so the rows and their split are the same: near-neutral
   snippets, |sentence score| < {movie.NEUTRAL_BAND}, are not in either set).
2. Tokenize each snippet with the regular expression `{WORD.pattern}`: a run of word characters
   with inner apostrophes/hyphens kept (`doesn't`, `well-made`, `Jackson's`), every other run of
   non-space characters one token (`,`, `...`, `".`, `:)`). Tokens keep their case.
3. Drop snippets of more than {MAX_WORDS} tokens (so a sentence fits 64 WordPiece tokens;
   dropped: {long_}).
4. Tag each token by its lowercased form in the lexicon: `B-POS` if mean >= {THRESHOLD}, `B-NEG` if
   mean <= {-THRESHOLD}, else `O`. For a lowercased token listed twice, the later line wins (as in
   vaderSentiment's `make_lex_dict`).
5. Sample {', '.join(f'{v} {k}' for k, v in SIZES.items())} sentences from the matching `vader_movie`
   split with `random.Random({SEED})`; rows in each file are sorted by id.

## Files

`train.jsonl`, `validation.jsonl`, `test.jsonl`: one JSON object per line with `tokens` (list of
str), `tags` (list of `"O"`, `"B-POS"`, `"B-NEG"`, one per token) and `id` (int, the line id in
`{movie.GROUND_TRUTH.split('/')[-1]}`). xformopt's token-classification task reads them as they are
(`--data xformopt/resources/vader_polarity_tags/test.jsonl`).

{chr(10).join(table)}

Most frequent tagged words in train: B-POS {common['B-POS']}; B-NEG {common['B-NEG']}.

## Rebuild

```
pip download --no-deps --no-binary :all: vaderSentiment==3.3.2 -d /tmp/vader
python scripts/build_vader_polarity_tags.py /tmp/vader/vaderSentiment-3.3.2.tar.gz
```
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", type=Path, help=f"{movie.SDIST}.tar.gz (the sdist, with additional_resources/)")
    ap.add_argument("--out-dir", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    if not tarfile.is_tarfile(args.source):
        sys.exit(f"error: {args.source} is not the {movie.SDIST} sdist tarball; download it with "
                 "pip download --no-deps --no-binary :all: vaderSentiment==3.3.2")

    data, lexicon_bytes, licence = read_sources(args.source)
    lexicon = parse_lexicon(lexicon_bytes)
    splits, stats = build(data, lexicon)
    ids = [r["id"] for rows in splits.values() for r in rows]
    assert len(ids) == len(set(ids)), "splits must be disjoint"

    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name in movie.SPLITS:
        with open(args.out_dir / f"{name}.jsonl", "w", encoding="utf-8", newline="\n") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in splits[name])
    (args.out_dir / "LICENSE").write_bytes(licence)
    hashes = {"lexicon": hashlib.sha256(lexicon_bytes).hexdigest(), "sentences": hashlib.sha256(data).hexdigest()}
    (args.out_dir / "README.md").write_text(readme(splits, stats, hashes, lexicon), encoding="utf-8", newline="\n")
    print(", ".join(f"{k}={len(v)}" for k, v in splits.items()) + f"; dropped long: {stats['long']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
