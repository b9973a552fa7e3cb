"""Tiny encoder-decoder models built in code (tests and benchmarks; no hub access needed).

No T5, BART or Marian checkpoint ships on PyPI, so these are built from a config: a word-level
tokenizer over a small alphabet of words (``tokenizers``, saved as a fast tokenizer), random weights
(seeded), or a few hundred steps of training on a seeded *reverse the words* task so that BLEU means
something (the tiny model learns it to near 100 BLEU in about a minute on one core).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = [f"w{i}" for i in range(24)]
SPECIALS = ["<pad>", "</s>", "<s>", "<unk>"]  # ids 0-3: pad, eos, bos, unk in every family below
FAMILIES = ("t5", "bart", "marian")
# Families without their own tests in test_seq2seq.py: T5Gemma 2 (a table row; text-only use of a model
# with a vision tower), T5Gemma (no row: the generic route) and Pegasus (no row either)
EXTRA_FAMILIES = ("t5gemma2", "t5gemma", "pegasus")


def reverse_pairs(n: int, seed: int, lengths=(3, 10)) -> list[dict]:
    """``n`` rows of {"source": words, "target": the words reversed} (seeded)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(*lengths))]
        rows.append({"source": " ".join(words), "target": " ".join(reversed(words))})
    return rows


def build_tokenizer(directory: Path, bos: bool):
    """A word-level fast tokenizer; sources end with </s> (and start with <s> where ``bos``: BART's scheme)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + WORDS)}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    single = "<s> $A </s>" if bos else "$A </s>"
    raw.post_processor = processors.TemplateProcessing(
        single=single, pair=f"{single} $B </s>", special_tokens=[("<s>", 2), ("</s>", 1)])
    raw.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="<pad>", eos_token="</s>", bos_token="<s>",
                                        unk_token="<unk>", model_max_length=64)
    tokenizer.save_pretrained(directory)
    return tokenizer


# flan-t5-small's shape (mT5-small's attention too): 6 heads of d_kv 64 (384 wide) in a 512-wide stream, a
# gated-GELU FFN of 1024, 8 + 8 layers, a head untied from the embeddings. FLAN_T5_TINY keeps what makes it
# differ from t5-small (heads x d_kv != d_model, gated GELU, untied head) at a size a test exports in seconds.
FLAN_T5_SMALL = dict(d_model=512, heads=6, d_kv=64, d_ff=1024, layers=8, gated=True, tied=False, vocab=32128)
FLAN_T5_TINY = dict(d_model=64, heads=6, d_kv=16, d_ff=128, layers=2, gated=True, tied=False)


def make_config(family: str, d_model: int = 64, layers: int = 2, heads: int = 4, vocab: int = len(SPECIALS) + len(WORDS),
                d_kv: int | None = None, d_ff: int | None = None, gated: bool = False, tied: bool = True):
    import transformers

    if family == "t5":
        return transformers.T5Config(vocab_size=vocab, d_model=d_model, d_kv=d_kv or d_model // heads,
                                     d_ff=d_ff or 2 * d_model, num_layers=layers, num_decoder_layers=layers,
                                     num_heads=heads, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
                                     relative_attention_num_buckets=8, dropout_rate=0.0,
                                     feed_forward_proj="gated-gelu" if gated else "relu", tie_word_embeddings=tied)
    if family in ("t5gemma", "t5gemma2"):
        return _gemma_config(family, d_model, layers, heads, vocab)
    common = dict(vocab_size=vocab, d_model=d_model, encoder_layers=layers, decoder_layers=layers,
                  encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=2 * d_model,
                  decoder_ffn_dim=2 * d_model, max_position_embeddings=64, pad_token_id=0, eos_token_id=1, bos_token_id=2,
                  dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
    if family == "bart":
        return transformers.BartConfig(**common, decoder_start_token_id=1)
    if family == "marian":
        return transformers.MarianConfig(**common, decoder_start_token_id=0, decoder_vocab_size=vocab,
                                         share_encoder_decoder_embeddings=True)
    if family == "pegasus":
        return transformers.PegasusConfig(**common, decoder_start_token_id=0)
    raise ValueError(f"unknown family {family!r} ({', '.join(FAMILIES + EXTRA_FAMILIES)})")


def _gemma_config(family: str, d_model: int, layers: int, heads: int, vocab: int):
    """T5Gemma (1 and 2): Gemma-style halves (RMSNorm, rotary, grouped KV heads, a sliding layer and a full
    one); T5Gemma 2's encoder also has a (tiny, unused) vision tower."""
    import transformers
    from transformers.models.t5gemma2 import configuration_t5gemma2 as t5g2

    text = dict(vocab_size=vocab, hidden_size=d_model, intermediate_size=2 * d_model, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=heads // 2, head_dim=d_model // heads,
                max_position_embeddings=64, sliding_window=48, layer_types=["sliding_attention", "full_attention"][:layers],
                pad_token_id=0, eos_token_id=1, bos_token_id=2, dropout_rate=0.0, attention_dropout=0.0)
    if family == "t5gemma":
        return transformers.T5GemmaConfig(encoder=dict(text), decoder=dict(text, is_decoder=True), vocab_size=vocab,
                                          pad_token_id=0, eos_token_id=1, bos_token_id=2, decoder_start_token_id=2,
                                          dropout_rate=0.0, attention_dropout=0.0)
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)
    return transformers.T5Gemma2Config(encoder=t5g2.T5Gemma2EncoderConfig(text_config=dict(text), vision_config=vision,
                                                                         mm_tokens_per_image=4),
                                       decoder=t5g2.T5Gemma2DecoderConfig(**text), dropout_rate=0.0,
                                       attention_dropout=0.0)


def build_seq2seq(directory: Path, family: str = "t5", *, train_steps: int = 0, seed: int = 0, **shape) -> Path:
    """Save a tiny ``family`` encoder-decoder with its tokenizer: random, or trained ``train_steps`` steps
    on the reverse task (seeded), with a generation config as the family's checkpoints carry one."""
    import torch
    from transformers import AutoModelForSeq2SeqLM, GenerationConfig

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(directory, bos=family == "bart")
    torch.manual_seed(seed)
    config = make_config(family, **shape)
    model = AutoModelForSeq2SeqLM.from_config(config)
    if train_steps:
        train(model, tokenizer, train_steps, seed)
    model.eval().save_pretrained(directory)
    start = getattr(config, "decoder_start_token_id", None)  # T5Gemma 2 names it in the generation config only
    gen = GenerationConfig(decoder_start_token_id=2 if start is None else start, eos_token_id=1, pad_token_id=0,
                           bos_token_id=2 if family == "bart" else None, max_length=24, num_beams=1,
                           forced_bos_token_id=2 if family == "bart" else None,
                           forced_eos_token_id=1 if family == "bart" else None)
    gen.save_pretrained(directory)
    return directory


def train(model, tokenizer, steps: int, seed: int, batch: int = 32) -> list[float]:
    """``steps`` AdamW steps on fresh seeded reverse pairs (a new batch each step: nothing to overfit)."""
    import torch

    rows = reverse_pairs(steps * batch, seed + 1000)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    torch.manual_seed(seed)
    model.train()
    losses = []
    for step in range(steps):
        chunk = rows[step * batch:(step + 1) * batch]
        enc = tokenizer([r["source"] for r in chunk], padding=True, return_tensors="pt")
        labels = tokenizer(text_target=[r["target"] for r in chunk], padding=True, return_tensors="pt")["input_ids"]
        labels[labels == tokenizer.pad_token_id] = -100
        loss = model(**enc, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    model.eval()
    return losses


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def inject_ffn_outliers(model, k: int = 4, c: float = 64.0, seed: int = 0) -> int:
    """T5's FFN activation outliers, made on purpose: in every layer, ``k`` seeded rows of ``wi`` times ``c``
    and the matching input columns of ``wo`` times 1/c. ReLU is positively homogeneous, so the float
    function is unchanged while ``wo``'s input gets ``k`` channels ``c`` times the rest. Returns the FFNs changed."""
    import numpy as np
    import torch

    rng = np.random.default_rng(seed)
    ffns = [block.layer[-1].DenseReluDense for stack in (model.encoder, model.decoder) for block in stack.block]
    with torch.no_grad():
        for ffn in ffns:
            rows = torch.as_tensor(rng.choice(ffn.wi.weight.shape[0], k, replace=False))
            ffn.wi.weight[rows] *= c
            ffn.wo.weight[:, rows] /= c
    return len(ffns)
