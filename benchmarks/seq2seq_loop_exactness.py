"""The decode loop of issue 55 against the loop before it, token for token, on an artifact's held-out sources.

Before: the search of commit ``BEFORE`` (scores in float64, stable sort) over ``session.run`` steps; after: this
tree (float32 scores as transformers keeps them, partition top-k), its steps IO-bound (the path ``bind_io=True``
takes, so both step kinds are covered). Both at batch 1 on the
vendored reverse test split (100 sources), greedy and ``--beams``; a differing row is printed with both
outputs and the after loop's top two first-step scores.

Run: python benchmarks/seq2seq_loop_exactness.py ARTIFACT --out benchmarks/results/seq2seq-ctranslate2/exactness.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from seq2seq_step_profile import BEFORE, old_search  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--beams", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    from xformopt.models import load_tokenizer
    from xformopt.resources import word_seq2seq_path
    from xformopt.seq2seq import generate as after
    from xformopt.seq2seq.generate import GenerationSettings
    from xformopt.seq2seq.runner import OrtSeq2Seq

    before = old_search()
    tokenizer = load_tokenizer(args.artifact)
    sources = [json.loads(line)["source"] for line in word_seq2seq_path("reverse", "test").read_text().splitlines()]
    runners = {"before": OrtSeq2Seq(args.artifact, 1, bind_io=False), "after": OrtSeq2Seq(args.artifact, 1, bind_io=True)}
    result = {"artifact": str(args.artifact), "before_commit": BEFORE, "sources": len(sources), "by_beams": {}}
    for beams in (1, args.beams):
        settings = GenerationSettings.from_model_dir(args.artifact).with_(max_new_tokens=args.max_new_tokens,
                                                                          num_beams=beams)
        differing = []
        for i, text in enumerate(sources):
            enc = tokenizer([text], return_tensors="np")
            ids, mask = enc["input_ids"].astype(np.int64), enc["attention_mask"].astype(np.int64)
            old = before.generate(runners["before"], ids, mask, settings)[0]
            new = after.generate(runners["after"], ids, mask, settings)[0]
            if old != new:
                differing.append({"row": i, "source": text, "before": old, "after": new})
        result["by_beams"][str(beams)] = {"identical": len(sources) - len(differing), "differing": differing}
        print(f"beams {beams}: {len(sources) - len(differing)}/{len(sources)} identical", file=sys.stderr)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
