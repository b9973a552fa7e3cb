"""Export parity for the two graphs: encoder states, the first decoder step and cached steps, ONNX
against PyTorch, on real source texts of several lengths (batch 1) and a padded batch of two."""

from __future__ import annotations

import numpy as np

from xformopt.exporting import compare, spread_by_length

CACHED_STEPS = 3  # cached decoder steps checked after the first (each feeds PyTorch's arg-max token)


def check_parity(torch_runner, onnx_runner, tokenizer, texts: list[str], steps: int = CACHED_STEPS) -> dict:
    """Worst |diff| and cosine of ``onnx_runner``'s outputs against ``torch_runner``'s (any two runners:
    fuse compares fused graphs with the unfused ones), with the lengths and batch sizes checked."""
    texts = list(texts)
    lengths = [len(tokenizer(t)["input_ids"]) for t in texts]
    picked = spread_by_length(lengths, what="source texts")
    cases = [[i] for i in picked] + [picked[:2]]
    worst = {"max_abs_diff": 0.0, "min_cosine": 1.0}
    per_output = {"encoder": 0.0, "first_step": 0.0, "cached_steps": 0.0}

    def record(kind: str, reference, candidate, mask=None) -> None:
        got = compare(np.asarray(reference, dtype=np.float32), np.asarray(candidate, dtype=np.float32), mask)
        worst["max_abs_diff"] = max(worst["max_abs_diff"], got["max_abs_diff"])
        worst["min_cosine"] = min(worst["min_cosine"], got["min_cosine"])
        per_output[kind] = max(per_output[kind], got["max_abs_diff"])

    for rows in cases:
        enc = tokenizer([texts[i] for i in rows], padding=True, return_tensors="np")
        ids, mask = enc["input_ids"].astype(np.int64), enc["attention_mask"].astype(np.int64)
        record("encoder", np.asarray(torch_runner.encoder_states(ids, mask)), onnx_runner.encoder_states(ids, mask), mask)
        ref_logits, ref_cache = torch_runner.start(ids, mask)
        got_logits, got_cache = onnx_runner.start(ids, mask)
        record("first_step", ref_logits, got_logits)
        for _ in range(steps):
            token = ref_logits.argmax(-1)[:, None].astype(np.int64)
            ref_logits, ref_cache = torch_runner.step(token, ref_cache)
            got_logits, got_cache = onnx_runner.step(token, got_cache)
            record("cached_steps", ref_logits, got_logits)
    return {**worst, "max_abs_diff_by_output": per_output, "sequence_lengths": [lengths[i] for i in picked],
            "batch_sizes": [len(c) for c in cases], "cached_steps": steps}
