"""Two random-weight DeBERTa-v3 encoders built in code (the HF hub is unreachable here): ``deb-tiny`` (the test
suite's shape, tests/test_deberta_v2.py) and ``deb-base`` (deberta-v3-base's shape: 12 layers, 768 wide, 12 heads,
256 position buckets), both with the test suite's small BERT WordPiece vocabulary, saved as feature-extraction
models (``DebertaV2Model``).

    python make_models.py OUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from transformers import BertTokenizerFast, DebertaV2Config, DebertaV2Model

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
from helpers import build_vocab  # noqa: E402

V3 = dict(relative_attention=True, pos_att_type=["p2c", "c2p"], max_relative_positions=-1, position_biased_input=False,
          type_vocab_size=0, share_att_key=True, norm_rel_ebd="layer_norm", max_position_embeddings=512)
SHAPES = {
    "deb-tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, position_buckets=8,
                     initializer_range=0.3),
    "deb-base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                     position_buckets=256),
}


def main(out: Path) -> None:
    vocab = build_vocab()
    (out / "vocab.txt").parent.mkdir(parents=True, exist_ok=True)
    (out / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tokenizer = BertTokenizerFast(vocab=str(out / "vocab.txt"), do_lower_case=True, model_max_length=128)
    for seed, (name, shape) in enumerate(SHAPES.items()):
        torch.manual_seed(seed)
        model = DebertaV2Model(DebertaV2Config(vocab_size=len(vocab), **{**V3, **shape})).eval()
        model.save_pretrained(out / name)
        tokenizer.save_pretrained(out / name)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
