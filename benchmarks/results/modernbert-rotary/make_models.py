"""Two random-weight ModernBERT encoders built in code (the HF hub is unreachable here): ``mb-tiny`` (the test
suite's shape, tests/test_modernbert.py) and ``mb-base`` (ModernBERT-base's shape: 22 layers, 768 wide, 12 heads,
FFN 1152, a global layer every 3rd, a 128-token window elsewhere), both with the test suite's small BERT WordPiece
vocabulary, saved as feature-extraction models (``ModernBertModel``).

    python make_models.py OUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from transformers import BertTokenizerFast, ModernBertConfig, ModernBertModel

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
from helpers import build_vocab  # noqa: E402

IDS = dict(pad_token_id=0, cls_token_id=2, sep_token_id=3, bos_token_id=2, eos_token_id=3, max_position_embeddings=512)
SHAPES = {
    "mb-tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                    global_attn_every_n_layers=2, local_attention=8),
    "mb-base": dict(hidden_size=768, num_hidden_layers=22, num_attention_heads=12, intermediate_size=1152,
                    global_attn_every_n_layers=3, local_attention=128),
}


def main(out: Path) -> None:
    vocab = build_vocab()
    out.mkdir(parents=True, exist_ok=True)
    (out / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tokenizer = BertTokenizerFast(vocab=str(out / "vocab.txt"), do_lower_case=True, model_max_length=128)
    for seed, (name, shape) in enumerate(SHAPES.items()):
        torch.manual_seed(seed)
        model = ModernBertModel(ModernBertConfig(vocab_size=len(vocab), **{**IDS, **shape})).eval()
        model.save_pretrained(out / name)
        tokenizer.save_pretrained(out / name)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
