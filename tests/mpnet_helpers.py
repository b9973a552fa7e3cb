"""Tiny MPNet checkpoints built in code (no network): pad id 1 as MPNet's embeddings assume."""

from __future__ import annotations

from pathlib import Path

from helpers import LABELS, TINY, build_vocab

MPNET_SPECIALS = ["[UNK]", "[PAD]", "[CLS]", "[SEP]", "[MASK]"]  # MPNet's padding_idx is 1


def mpnet_tokenizer(directory: Path) -> Path:
    from transformers import BertTokenizerFast

    vocab = list(dict.fromkeys(MPNET_SPECIALS + build_vocab()))
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n")
    BertTokenizerFast(vocab=str(directory / "vocab.txt"), do_lower_case=True,
                      model_max_length=128).save_pretrained(directory)
    return directory


def tiny_mpnet(directory: Path, *, classifier: bool, seed: int = 0) -> Path:
    import shutil

    import torch
    from transformers import MPNetConfig, MPNetForSequenceClassification, MPNetModel

    tok = mpnet_tokenizer(directory.parent / f"{directory.name}-tokenizer")
    vocab = len((tok / "vocab.txt").read_text().splitlines())
    extra = dict(num_labels=2, id2label=LABELS, label2id={v: k for k, v in LABELS.items()}) if classifier else {}
    config = MPNetConfig(vocab_size=vocab, hidden_size=TINY["hidden"], num_hidden_layers=TINY["layers"],
                         num_attention_heads=TINY["heads"], intermediate_size=TINY["intermediate"],
                         max_position_embeddings=130, pad_token_id=1, bos_token_id=2, eos_token_id=3, **extra)
    torch.manual_seed(seed)
    model = (MPNetForSequenceClassification if classifier else MPNetModel)(config).eval()
    model.save_pretrained(directory)
    for item in tok.iterdir():
        shutil.copy2(item, directory / item.name)
    return directory
