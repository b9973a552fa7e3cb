"""Tiny pretrained-style students of another family and vocabulary, built in code (no network): what a recipe's
``student: minilm`` is, at the size of the tiny teachers in conftest.py."""

from __future__ import annotations

from pathlib import Path

from helpers import read_jsonl


def byte_bpe_tokenizer(directory: Path):
    """A byte-level BPE tokenizer of RoBERTa's kind (600 tokens, <s>=0, <pad>=1, </s>=2; no token_type_ids), trained
    on the vendored train split (no network) and saved in ``directory``."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import RobertaTokenizerFast

    from xformopt.resources import vader_split_path

    directory.mkdir(parents=True, exist_ok=True)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([r["text"] for r in read_jsonl(vader_split_path("train"))], vocab_size=600,
                            min_frequency=2, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
                            show_progress=False)
    bpe.save_model(str(directory))
    tokenizer = RobertaTokenizerFast(vocab=str(directory / "vocab.json"), merges=str(directory / "merges.txt"),
                                     model_max_length=128)
    tokenizer.save_pretrained(directory)
    return tokenizer


def tiny_roberta_encoder(directory: Path) -> Path:
    """A RobertaModel (no task head, as MiniLM ships) of 1 layer, hidden 32, with its own byte-level BPE vocabulary
    (600 tokens, <s>=0, <pad>=1, </s>=2) trained here on the vendored train split."""
    import torch
    from transformers import RobertaConfig, RobertaModel

    tokenizer = byte_bpe_tokenizer(directory)
    torch.manual_seed(5)
    config = RobertaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=130, type_vocab_size=1,
                           pad_token_id=1, bos_token_id=0, eos_token_id=2)
    RobertaModel(config, add_pooling_layer=False).eval().save_pretrained(directory)
    return directory
