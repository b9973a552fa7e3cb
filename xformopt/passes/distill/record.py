"""What distill's record says of its losses and metrics (the record itself: passes.records.DistillRecord)."""

from __future__ import annotations


def metrics_only(entry: dict) -> dict:
    keep = ("accuracy", "agreement", "kl_to_teacher", "cosine", "min_cosine", "mse")
    return {"step": entry["step"], **{k: entry[k] for k in keep if k in entry}}


def teacher_metrics(objective: str, heldout_teacher, heldout_enc) -> dict:
    """The teacher against itself and the labels: the reference line of the record's quality."""
    if objective != "logits":
        return {"cosine": 1.0}
    out = {"agreement": 1.0}
    if heldout_enc.labels is not None:
        pred = heldout_teacher.argmax(-1).numpy()
        out = {"accuracy": round(float((pred == heldout_enc.labels).mean()), 6), **out}
    return out


LOSS_DEFINITIONS = {
    "logits": {
        "soft_kl": "T^2 * KL(softmax(teacher/T) || softmax(student/T)), summed over classes, mean over the batch",
        "hard_ce": "cross-entropy of the student's logits on the gold labels, mean over the batch",
        "hidden_mse": "MSE of student layer i vs teacher layer layer_map[i] token states over real tokens, mean over layers",
        "attention_mse": "MSE of head-averaged attention maps over real (query, key) pairs, mean over mapped layers",
        "relation_kl": "MiniLM: KL(teacher || student) of softmax(A A^T / sqrt(d_r)) for A in query, key, value of "
                       "the last student layer and its mapped teacher layer, R relation heads, over real positions",
        "total": "alpha * soft_kl + (1 - alpha) * hard_ce (soft_kl alone without labels) "
                 "+ hidden_weight * hidden_mse + attention_weight * attention_mse + relation_weight * relation_kl",
    },
    "embedding": {
        "embedding_mse": "mean over batch and dimensions of (student - teacher)^2, mean-pooled embeddings",
        "embedding_cosine": "mean over the batch of 1 - cos(student, teacher)",
        "hidden_mse": "MSE of student layer i vs teacher layer layer_map[i] token states over real tokens, mean over layers",
        "attention_mse": "MSE of head-averaged attention maps over real (query, key) pairs, mean over mapped layers",
        "total": "mse_weight * embedding_mse + cosine_weight * embedding_cosine "
                 "+ hidden_weight * hidden_mse + attention_weight * attention_mse",
    },
}
