"""The distillation loss terms. Each is a plain function of tensors, tested against hand-computed values.

Notation: ``s`` student, ``t`` teacher, ``T`` temperature, ``B`` batch, ``mask`` the attention mask
(1 for real tokens, 0 for padding).

- ``soft_kl``: T^2 * KL(softmax(t/T) || softmax(s/T)), summed over classes, mean over the batch
  (Hinton et al. 2015; the T^2 keeps its gradient scale comparable to the hard-label term as T changes).
- ``hard_ce``: cross-entropy of the student's logits on the gold labels, mean over the batch.
- ``embedding_mse``: mean over the batch and the dimensions of (s - t)^2 (mean-pooled sentence embeddings).
- ``embedding_cosine``: mean over the batch of 1 - cos(s, t).
- ``hidden_mse``: for each (student layer, teacher layer) pair of the layer map, the mean squared
  difference of the two layers' token states over real tokens and hidden units; averaged over pairs.
- ``attention_mse``: for each pair, the attention probabilities averaged over heads (so a student
  with pruned heads still compares), mean squared difference over real (query, key) positions;
  averaged over pairs.

- ``relation_kl``: MiniLM(v2)'s self-attention relations (Wang et al. 2020/2021): for the query, key and
  value vectors of one student layer and one teacher layer, each split into R relation heads,
  softmax(A A^T / sqrt(d_r)) over the real keys; KL(teacher || student) per real query position, averaged
  over positions, relation heads and the three kinds. The relation matrices are L x L whatever the widths,
  so a student with pruned heads or a narrower hidden size still compares (R divides both widths).

``combine`` mixes them: classification ``alpha * soft_kl + (1 - alpha) * hard_ce`` (only ``soft_kl``
when there are no labels), feature extraction ``mse_weight * embedding_mse + cosine_weight *
embedding_cosine``, plus ``hidden_weight * hidden_mse + attention_weight * attention_mse + relation_weight *
relation_kl`` for both.
"""

from __future__ import annotations

from collections.abc import Sequence


def soft_kl(student_logits, teacher_logits, temperature: float):
    import torch.nn.functional as F

    log_p_s = F.log_softmax(student_logits / temperature, dim=-1)
    log_p_t = F.log_softmax(teacher_logits.to(student_logits.dtype) / temperature, dim=-1)
    kl = (log_p_t.exp() * (log_p_t - log_p_s)).sum(-1)
    return kl.mean() * temperature ** 2


def hard_ce(student_logits, labels):
    """Mean over the labelled rows; rows labelled -100 (teacher-labelled text) are left out."""
    import torch.nn.functional as F

    if not bool((labels != -100).any()):
        return student_logits.sum() * 0.0
    return F.cross_entropy(student_logits, labels, ignore_index=-100)


def embedding_mse(student, teacher):
    return ((student - teacher.to(student.dtype)) ** 2).mean()


def embedding_cosine(student, teacher):
    import torch.nn.functional as F

    return (1 - F.cosine_similarity(student, teacher.to(student.dtype), dim=-1)).mean()


def hidden_mse(student_states: Sequence, teacher_states: Sequence, mask):
    """Mean over the layer pairs of the masked per-token MSE; states are [B, L, H], mask [B, L]."""
    m = mask.unsqueeze(-1).to(student_states[0].dtype)
    tokens = m.sum().clamp(min=1.0)
    total = 0.0
    for s, t in zip(student_states, teacher_states, strict=True):
        diff = (s - t.to(s.dtype)) ** 2 * m
        total = total + diff.sum() / (tokens * s.shape[-1])
    return total / max(len(student_states), 1)


def attention_mse(student_attn: Sequence, teacher_attn: Sequence, mask):
    """Mean over the layer pairs of the MSE between head-averaged attention maps [B, heads, L, L],
    over real (query, key) positions only."""
    pair = (mask.unsqueeze(-1) * mask.unsqueeze(-2)).to(student_attn[0].dtype)  # [B, L, L]
    positions = pair.sum().clamp(min=1.0)
    total = 0.0
    for s, t in zip(student_attn, teacher_attn, strict=True):
        diff = (s.mean(1) - t.to(s.dtype).mean(1)) ** 2 * pair
        total = total + diff.sum() / positions
    return total / max(len(student_attn), 1)


def relation_kl(student_qkv: Sequence, teacher_qkv: Sequence, mask, relation_heads: int):
    """MiniLM relation loss over the (query, key, value) outputs [B, L, width] of one layer pair."""
    import torch.nn.functional as F

    keys = mask[:, None, None, :].bool()  # [B, 1, 1, L]: padding keys get no probability
    queries = mask.to(student_qkv[0].dtype)  # [B, L]
    denominator = (queries.sum() * relation_heads).clamp(min=1.0)

    def log_relations(a):
        b, length, width = a.shape
        heads = a.view(b, length, relation_heads, width // relation_heads).transpose(1, 2)  # [B, R, L, dr]
        scores = heads @ heads.transpose(-1, -2) / (width // relation_heads) ** 0.5
        return F.log_softmax(scores.masked_fill(~keys, float("-inf")), dim=-1)

    total = 0.0
    for s, t in zip(student_qkv, teacher_qkv, strict=True):
        log_s, log_t = log_relations(s), log_relations(t.to(s.dtype))
        kl = (log_t.exp() * (log_t - log_s)).masked_fill(~keys, 0.0).sum(-1)  # [B, R, L]
        total = total + (kl * queries[:, None, :]).sum() / denominator
    return total / max(len(student_qkv), 1)


def combine(terms: dict, weights: dict):
    """Weighted sum of the terms present (a term absent from ``terms`` contributes nothing)."""
    total = 0.0
    for name, value in terms.items():
        w = weights.get(name, 0.0)
        if w:
            total = total + w * value
    return total


def weights_for(objective: str, has_labels: bool, *, alpha: float, mse_weight: float, cosine_weight: float,
                hidden_weight: float, attention_weight: float, relation_weight: float = 0.0) -> dict[str, float]:
    """The weight of each term for this objective; terms with weight 0 are not computed."""
    if objective == "logits":
        w = {"soft_kl": alpha if has_labels else 1.0, "hard_ce": (1 - alpha) if has_labels else 0.0}
    else:
        w = {"embedding_mse": mse_weight, "embedding_cosine": cosine_weight}
    w.update({"hidden_mse": hidden_weight, "attention_mse": attention_weight, "relation_kl": relation_weight})
    return {k: float(v) for k, v in w.items() if v}
