"""Decoders built from a config in code, for tests and speed benchmarks (no hub access needed).

No pretrained decoder or GPT-2 tokenizer is reachable offline, so the tokenizer is a byte-level BPE
trained with the ``tokenizers`` library on the vendored review text, wrapped as a
``GPT2TokenizerFast``, and the weights are random (seeded) or briefly trained on the same text so
that perplexity is meaningfully below the vocabulary size. Speed depends only on the shapes, so a
random model with GPT-2-small's shapes is a fair subject for timing; quality numbers need a real
checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path

from xformopt.resources import vader_split_path

EOS = "<|endoftext|>"


def corpus(split: str = "train") -> list[str]:
    return [json.loads(line)["text"] for line in vader_split_path(split).read_text(encoding="utf-8").splitlines() if line.strip()]


def build_tokenizer(directory: Path, vocab_size: int = 1000, context: int = 128):
    """A byte-level BPE (GPT-2's scheme) trained on the vendored train split, saved as a fast tokenizer."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2TokenizerFast

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(corpus(), vocab_size=vocab_size, min_frequency=2, special_tokens=[EOS], show_progress=False)
    raw = directory / "bpe-tokenizer.json"
    bpe.save(str(raw))
    tokenizer = GPT2TokenizerFast(tokenizer_file=str(raw), bos_token=EOS, eos_token=EOS, unk_token=EOS,
                                  model_max_length=context)
    raw.unlink()
    tokenizer.save_pretrained(directory)
    return tokenizer


def config_for(family: str, vocab_size: int, context: int, layers: int, hidden: int, heads: int, eos_id: int):
    from transformers import GPT2Config, LlamaConfig

    if family == "gpt2":
        return GPT2Config(vocab_size=vocab_size, n_positions=context, n_embd=hidden, n_layer=layers, n_head=heads,
                          bos_token_id=eos_id, eos_token_id=eos_id)
    if family == "llama":
        return LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                           num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=context,
                           bos_token_id=eos_id, eos_token_id=eos_id)
    raise ValueError(f"unknown family {family!r} (gpt2, llama)")


def build_decoder(directory: Path, family: str = "gpt2", *, layers: int = 2, hidden: int = 64, heads: int = 4,
                  vocab_size: int | None = None, tokenizer_vocab: int = 1000, context: int = 128, seed: int = 0,
                  train_steps: int = 0, train_batch: int = 16, train_length: int = 64, make_config=None) -> Path:
    """Save a decoder (random, or trained ``train_steps`` steps on the vendored text) with its tokenizer.

    ``vocab_size`` defaults to the tokenizer's; a larger one (e.g. GPT-2's 50257) gives the real LM-head
    shape while the tokenizer only ever produces its own ids. ``make_config(vocab_size, eos_id)``, when
    given, builds any transformers config instead of ``family``'s (tests and benchmarks pass their own)."""
    import torch
    from transformers import AutoModelForCausalLM

    directory = Path(directory)
    tokenizer = build_tokenizer(directory, tokenizer_vocab, context)
    torch.manual_seed(seed)
    vocab = vocab_size or len(tokenizer)
    config = (make_config(vocab, tokenizer.eos_token_id) if make_config
              else config_for(family, vocab, context, layers, hidden, heads, tokenizer.eos_token_id))
    model = AutoModelForCausalLM.from_config(config)
    if train_steps:
        train(model, tokenizer, train_steps, train_batch, min(train_length, context), seed)
    model.eval().save_pretrained(directory)
    model.generation_config.save_pretrained(directory)
    return directory


def train(model, tokenizer, steps: int, batch: int, length: int, seed: int) -> list[float]:
    """A few steps of next-token training on the vendored train split (so perplexity means something)."""
    import torch

    stream = [t for text in corpus() for t in tokenizer(text)["input_ids"] + [tokenizer.eos_token_id]]
    data = torch.tensor(stream[: len(stream) // length * length]).view(-1, length)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    losses = []
    for _ in range(steps):
        rows = data[torch.randint(0, len(data), (batch,), generator=generator)]
        loss = model(input_ids=rows, labels=rows).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    model.eval()
    return losses
