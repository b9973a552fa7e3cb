"""The tiny trained BertForQuestionAnswering and synthetic SQuAD rows that benchmarks/qa_agreement.py
was measured on (the same model the tests train: tests/qa_helpers.py), written under DIR:

    python benchmarks/qa_tiny_model.py /tmp/qa-bench
    python benchmarks/qa_agreement.py /tmp/qa-bench/model /tmp/qa-bench/rows.jsonl
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import conftest  # noqa: F401  (offline, passive OpenMP: set before torch loads)
from conftest import build_vocab
from qa_helpers import make_rows, train_tiny_qa, write_jsonl


def main() -> None:
    from transformers import BertTokenizerFast

    root = Path(sys.argv[1])
    root.mkdir(parents=True, exist_ok=True)
    tok = root / "tokenizer"
    tok.mkdir(exist_ok=True)
    (tok / "vocab.txt").write_text("\n".join(build_vocab()) + "\n")
    BertTokenizerFast(vocab_file=str(tok / "vocab.txt"), do_lower_case=True, model_max_length=128).save_pretrained(tok)
    train_tiny_qa(tok, root / "model", steps=250, seed=0)
    # up to 30 filler sentences: many contexts are longer than one 128-token window
    write_jsonl(root / "rows.jsonl", make_rows(500, seed=7, fillers=(0, 30)))


if __name__ == "__main__":
    main()
