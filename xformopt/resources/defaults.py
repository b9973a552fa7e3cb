"""What passes fall back to when the user names no data of their own, and when that is not allowed.

The vendored VADER movie-review splits can feed any model as plain text (calibration, unlabeled
distillation, embeddings), but their labels (negative, positive) can only score a classifier with
exactly those classes: a 3-class tweet model or a LABEL_0/LABEL_1 checkpoint would be pruned,
distilled or budgeted against labels that say nothing about it. Such a run is refused up front.
"""

from __future__ import annotations

from xformopt.errors import InputError

VADER_LABELS = ("negative", "positive")

# (pass, option) -> (vendored split, what reads it, the optimize flag that replaces it), for options
# whose fallback is read *with labels* when the model is a classifier.
LABELLED_FALLBACKS = {
    ("prune", "data"): ("train/test", "prune's importance and held-out rows", "--train-data"),
    ("distill", "train_data"): ("train", "distill's training rows", "--train-data"),
    ("distill", "eval_data"): ("validation", "distill's evaluation rows", "--validation-data"),
    ("quantize", "budget_data"): ("validation", "the INT8 accuracy budget", "--validation-data"),
}


def _reads(name: str, option: str, options: dict) -> bool:
    if name == "quantize":
        return options.get("max_accuracy_drop") is not None
    if name == "distill" and option == "eval_data":
        return not options.get("train_data")  # with train_data, evaluation rows are split from it
    return True


def labels_cover_vendored(label2id: dict) -> bool:
    return sorted(name.casefold() for name in label2id) == list(VADER_LABELS)


def check_labelled_fallbacks(steps, task, label2id: dict) -> None:
    """Refuse before any work when a pass would score a classifier (``task``: xformopt.tasks.Task) on
    vendored labels it does not have."""
    if not task.labels_from_config or labels_cover_vendored(label2id):
        return
    for name, options in steps:
        options = options or {}
        for (pass_name, option), (split, what, flag) in LABELLED_FALLBACKS.items():
            if pass_name == name and not options.get(option) and _reads(name, option, options):
                # No names in config.json: transformers calls the classes LABEL_0, LABEL_1, ...
                labels = ", ".join(sorted(label2id)) or "unnamed: LABEL_0, LABEL_1, ..."
                raise InputError(
                    f"{what} would fall back to the vendored movie-review {split} split, whose labels "
                    f"({', '.join(VADER_LABELS)}) are not this model's ({labels}); give rows labelled for your "
                    f"model: {flag} FILE on `xformopt optimize`, `{option}` in the recipe's {name} step")
