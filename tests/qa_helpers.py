"""Synthetic SQuAD-style rows and a tiny BertForQuestionAnswering trained on them (tests, benchmarks).

A context states what a few subjects do ("the fans will watch the funny movie ."), padded with filler
sentences; the question asks for one verb's object ("what will they watch ?"), so the model has to
route the question's verb to the matching fact and copy its object span. Training rows whose verb is
absent point at [CLS], as run_qa trains windows without the answer, so a window that lacks the answer
scores low and the best span over several stride windows is the right one.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

SUBJECTS = ["man", "women", "kids", "director", "writer", "cast", "audience", "fans", "actors", "people"]
VERBS = ["like", "love", "want", "need", "make", "watch", "see", "find"]
OBJECTS = ["film", "movie", "story", "comedy", "drama", "music", "picture", "script", "thriller", "plot",
           "screen", "cinema", "flick", "title", "piece", "documentary"]
QUESTIONS = ["what will they {} ?", "so what will they {} ?", "what is it that they will {} ?"]
ADJECTIVES = ["good", "bad", "new", "old", "big", "funny", "sweet", "great", "dull", "long"]


def make_row(rng: random.Random, fillers: int, answered: bool = True, answer_last: bool = False) -> dict:
    verbs = rng.sample(VERBS, rng.randint(2, 4))
    asked = verbs[0] if answered else rng.choice([v for v in VERBS if v not in verbs])
    facts = []  # (text before the object, object, is the answer)
    for verb in verbs:
        obj = rng.choice(OBJECTS)
        if rng.random() < 0.5:
            obj = f"{rng.choice(ADJECTIVES)} {obj}"
        facts.append((f"the {rng.choice(SUBJECTS)} will {verb} the ", obj, answered and verb == asked))
    filler = [(f"the {rng.choice(SUBJECTS)} is {rng.choice(ADJECTIVES)} .", None, False) for _ in range(fillers)]
    if answer_last:  # the answering fact at the very end: in a later stride window
        parts = filler + [f for f in facts if not f[2]] + [f for f in facts if f[2]]
    else:
        parts = facts + filler
        rng.shuffle(parts)
    context, answer, start = "", None, None
    for prefix, obj, is_answer in parts:
        context += (" " if context else "") + prefix
        if obj is not None:
            if is_answer:
                answer, start = obj, len(context)
            context += obj + " ."
    question = rng.choice(QUESTIONS).format(asked)
    answers = {"text": [answer], "answer_start": [start]} if answered else {"text": [], "answer_start": []}
    return {"question": question, "context": context, "answers": answers}


def make_rows(n: int, seed: int, fillers: tuple[int, int] = (0, 8), unanswered: float = 0.0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        row = make_row(rng, rng.randint(*fillers), answered=rng.random() >= unanswered)
        rows.append({"id": f"q{seed}-{i}", **row})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def train_tiny_qa(tokenizer_dir: Path, out_dir: Path, steps: int = 250, seed: int = 0, batch_size: int = 16) -> Path:
    """A 2-layer, 64-wide BertForQuestionAnswering trained on synthetic rows; saved with its tokenizer."""
    import shutil

    import torch
    from transformers import BertConfig, BertForQuestionAnswering, BertTokenizerFast

    torch.manual_seed(seed)
    tokenizer = BertTokenizerFast.from_pretrained(tokenizer_dir)
    vocab = len((Path(tokenizer_dir) / "vocab.txt").read_text().splitlines())
    config = BertConfig(vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=128, architectures=["BertForQuestionAnswering"])
    model = BertForQuestionAnswering(config)
    rows = make_rows(steps * batch_size, seed=1000 + seed, fillers=(0, 6), unanswered=0.15)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=5e-3, total_steps=steps, pct_start=0.1)
    model.train()
    for step in range(steps):
        batch = rows[step * batch_size:(step + 1) * batch_size]
        enc = tokenizer([r["question"] for r in batch], [r["context"] for r in batch], truncation="only_second",
                        max_length=128, padding=True, return_tensors="pt")
        starts, ends = [], []
        for j, r in enumerate(batch):
            if r["answers"]["text"]:
                a, t = r["answers"]["answer_start"][0], r["answers"]["text"][0]
                s, e = enc.char_to_token(j, a, sequence_index=1), enc.char_to_token(j, a + len(t) - 1, sequence_index=1)
                starts.append(s if s is not None and e is not None else 0)
                ends.append(e if s is not None and e is not None else 0)
            else:
                starts.append(0)
                ends.append(0)
        loss = model(**enc, start_positions=torch.tensor(starts), end_positions=torch.tensor(ends)).loss
        loss.backward()
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
    model.eval()
    model.save_pretrained(out_dir)
    for item in Path(tokenizer_dir).iterdir():
        shutil.copy2(item, Path(out_dir) / item.name)
    return Path(out_dir)
