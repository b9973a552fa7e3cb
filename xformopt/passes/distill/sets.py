"""Distillation's data: the training and evaluation rows (kept apart from the rows a run reports on),
the extra texts the teacher labels, and a digest of them for the checkpoint identity.

``ctx`` is the pass's PassContext (``spec`` and ``heldout_texts``), ``options`` its DistillOptions."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from xformopt.data import load_text_dataset
from xformopt.errors import InputError
from xformopt.passes.distill.augment import augmented
from xformopt.resources import vader_split_path


def load_sets(ctx, options, labelled: bool):
    """(training rows, evaluation rows, notes): see the module docstring for defaults and disjointness."""
    label_column = options.label_column if labelled else ""
    kwargs = dict(text_column=options.text_column, text_pair_column=options.text_pair_column,
                  label_column=label_column, label2id=(ctx.spec.label2id or None) if labelled else None)
    notes = {}
    if options.train_data:
        train = load_text_dataset(Path(options.train_data), **kwargs)
    else:
        train = load_text_dataset(vader_split_path("train"), **{**kwargs, "text_column": None, "text_pair_column": ""})
    if options.eval_data:
        heldout = load_text_dataset(Path(options.eval_data), **kwargs, limit=options.eval_samples, seed=options.seed)
    elif options.train_data:
        if len(train) < 16:
            raise InputError(f"{options.train_data} has {len(train)} rows; distillation needs at least 16 "
                             "(training + held-out evaluation), or pass eval_data")
        want = options.eval_samples or min(1000, max(8, len(train) // 5))
        heldout, train = train.split(min(0.5, want / len(train)), options.seed)
    else:
        heldout = load_text_dataset(vader_split_path("validation"), **{**kwargs, "text_column": None, "text_pair_column": ""},
                                    limit=options.eval_samples, seed=options.seed)
    reported = set(ctx.heldout_texts)
    keep_eval = [i for i, t in enumerate(heldout.texts) if t not in reported]
    notes["eval_rows_dropped_as_in_reported_heldout"] = len(heldout) - len(keep_eval)
    if not keep_eval:
        raise InputError("every evaluation row is also in the held-out set the run reports on; pass eval_data "
                         "with other rows")
    heldout = heldout.subset(keep_eval) if len(keep_eval) < len(heldout) else heldout
    excluded = reported | set(heldout.texts)
    keep = [i for i, t in enumerate(train.texts) if t not in excluded]
    notes["train_rows_dropped_as_in_heldout_or_eval"] = len(train) - len(keep)
    if not keep:
        raise InputError(f"no training rows left: all {len(train)} rows of {train.source} are also in the held-out "
                         "or evaluation rows; pass train_data with other texts")
    if options.train_samples and options.train_samples < len(keep):
        keep = sorted(np.random.default_rng(options.seed).permutation(keep)[: options.train_samples].tolist())
    train = train.subset(keep) if len(keep) < len(train) else train
    if labelled and options.select == "accuracy" and heldout.labels is None:
        raise InputError("select: accuracy needs labels in the evaluation rows; pass eval_data with labels "
                         "or select: agreement")
    return train, heldout, notes




def extra_training_texts(options, train_set) -> tuple[list[str], dict]:
    """Texts for the teacher to label beside the training rows: unlabeled_data, else ``augment`` augmented
    copies of the training texts; rows also in the training set are not repeated."""
    if options.unlabeled_data:
        path = Path(options.unlabeled_data)
        if path.suffix.lower() == ".txt":  # one text per line
            texts = [t.strip() for t in path.read_text(encoding="utf-8", errors="replace").splitlines() if t.strip()]
        else:
            texts = load_text_dataset(path, text_column=options.text_column, label_column="").texts
        if not texts:
            raise InputError(f"unlabeled_data {path} has no texts")
        source = options.unlabeled_data
    elif options.augment:
        texts = augmented(train_set.texts, options.augment, options.seed)
        source = f"{options.augment} augmented cop{'y' if options.augment == 1 else 'ies'} of each training text"
    else:
        return [], None
    seen = set(train_set.texts)
    kept = list(dict.fromkeys(t for t in texts if t not in seen))
    return kept, {"source": source, "rows": len(kept), "labels": "the teacher's (soft targets only)"}




def texts_digest(*datasets) -> str:
    h = hashlib.sha256()
    for ds in datasets:
        for i, t in enumerate(ds.texts):
            h.update(t.encode())
            h.update(b"\x1f")
            if ds.text_pairs:
                h.update(ds.text_pairs[i].encode())
            if ds.labels is not None:
                h.update(str(ds.labels[i]).encode())
            h.update(b"\x1e")
        h.update(b"\x1d")
    return h.hexdigest()
