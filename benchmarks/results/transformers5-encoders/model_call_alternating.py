"""Model call alone at batch 1 on real texts, two or more artifacts alternating (the order reversed every
other round), onnxruntime directly without spinning; median per artifact at 1 and 2 intra-op threads.

    python model_call_alternating.py ROUNDS DATA.jsonl ARTIFACT...
"""

from __future__ import annotations

import json
import sys
import time


def main() -> None:
    import numpy as np
    import onnxruntime as ort
    from transformers import AutoTokenizer

    rounds, data, names = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    with open(data, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f][:300]
    tok = AutoTokenizer.from_pretrained(names[0])
    feeds = [{k: v.astype(np.int64) for k, v in tok(t, return_tensors="np", truncation=True, max_length=384).items()
              if k in ("input_ids", "attention_mask")} for t in texts]
    for threads in (1, 2):
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        sessions = {n: ort.InferenceSession(f"{n}/model.onnx", options, providers=["CPUExecutionProvider"]) for n in names}
        times: dict[str, list[float]] = {n: [] for n in names}
        for r in range(rounds + 10):
            feed = feeds[r % len(feeds)]
            for n in names if r % 2 == 0 else names[::-1]:
                start = time.perf_counter()
                sessions[n].run(None, feed)
                if r >= 10:
                    times[n].append((time.perf_counter() - start) * 1e3)
        base = np.median(times[names[0]])
        print(f"threads {threads}: " + "  ".join(f"{n} p50 {np.median(v):.2f} ms ({np.median(v) / base:.3f}x)"
                                                for n, v in times.items()))


if __name__ == "__main__":
    main()
