"""The tiny local model of these measurements: a random 2-layer BERT classifier (hidden 64) with a WordPiece
vocabulary from the vendored training split, saved to ./tiny (as tests/conftest.py builds its tiny_classifier)."""

import json
import re
from collections import Counter

import torch
from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

from xformopt.resources import vader_split_path

words = Counter()
for line in open(vader_split_path("train")):
    words.update(re.findall(r"[a-z]+", json.loads(line)["text"].lower()))
letters = [chr(c) for c in range(97, 123)]
vocab = list(dict.fromkeys(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + letters
                           + [w for w, _ in words.most_common(300)] + [f"##{c}" for c in letters]))
open("vocab.txt", "w").write("\n".join(vocab) + "\n")
tokenizer = BertTokenizerFast(vocab="vocab.txt", do_lower_case=True, model_max_length=128)
torch.manual_seed(0)
config = BertConfig(vocab_size=len(vocab), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=128, max_position_embeddings=128, num_labels=2,
                    id2label={0: "negative", 1: "positive"}, label2id={"negative": 0, "positive": 1})
BertForSequenceClassification(config).eval().save_pretrained("tiny")
tokenizer.save_pretrained("tiny")
