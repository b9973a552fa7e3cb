"""The tiny trained BertForQuestionAnswering and synthetic SQuAD rows that benchmarks/qa_agreement.py
was measured on (the same model the tests train: tests/qa_helpers.py), written under DIR:

    python benchmarks/qa_tiny_model.py /tmp/qa-bench [--steps 250] [--rows 500]
    python benchmarks/qa_agreement.py /tmp/qa-bench/model /tmp/qa-bench/rows.jsonl
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import conftest  # noqa: F401  (offline, passive OpenMP: set before torch loads)
from helpers import build_vocab
from qa_helpers import make_rows, train_tiny_qa, write_jsonl


def main() -> None:
    import argparse

    from transformers import BertTokenizerFast

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--steps", type=int, default=250, help="training steps of 16 rows (the tests train 250)")
    parser.add_argument("--rows", type=int, default=500, help="held-out rows written to DIR/rows.jsonl")
    args = parser.parse_args()
    root = args.dir
    root.mkdir(parents=True, exist_ok=True)
    tok = root / "tokenizer"
    tok.mkdir(exist_ok=True)
    (tok / "vocab.txt").write_text("\n".join(build_vocab()) + "\n")
    BertTokenizerFast(vocab=str(tok / "vocab.txt"), do_lower_case=True, model_max_length=128).save_pretrained(tok)
    train_tiny_qa(tok, root / "model", steps=args.steps, seed=0)
    # up to 30 filler sentences: many contexts are longer than one 128-token window
    write_jsonl(root / "rows.jsonl", make_rows(args.rows, seed=7, fillers=(0, 30)))


if __name__ == "__main__":
    main()
