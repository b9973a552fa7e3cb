"""How much a row's answer depends on its batch mates under dynamic INT8 (one activation scale per
tensor): each held-out text served alone vs in the server's batches (random arrivals of --batch texts,
cut into the scheduler's length groups). Prints label flips (classifiers) or cosine (embedders).

    python benchmarks/serve_int8_batch_dependence.py ARTIFACT [--rows 512] [--batch 32] [--int8-scales per-tensor]
"""

from __future__ import annotations

import argparse
import json
import os
import random

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("artifact")
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--int8-scales", default="per-token", choices=("per-token", "per-tensor"))
    args = parser.parse_args()

    import onnx

    from xformopt.resources import vader_split_path
    from xformopt.runtime.predictor import load_predictor
    from xformopt.serve.scheduler import length_groups

    ops = {n.op_type for n in onnx.load(f"{args.artifact}/model.onnx", load_external_data=False).graph.node}
    texts = [json.loads(line)["text"] for line in vader_split_path("test").read_text(encoding="utf-8").splitlines()][:args.rows]
    predictor = load_predictor(args.artifact, args.threads, args.int8_scales)
    prepared = predictor.prepare(texts)
    alone = [predictor.run_rows(p.rows)[0] for p in prepared]
    order = list(range(len(texts)))
    random.Random(0).shuffle(order)
    batched: dict[int, np.ndarray] = {}
    for start in range(0, len(order), args.batch):
        arrivals = order[start:start + args.batch]
        lengths = [prepared[i].rows[0].length for i in arrivals]
        for group in length_groups(lengths, args.batch, 0.25):
            rows = [arrivals[g] for g in group]
            for i, out in zip(rows, predictor.run_rows([prepared[i].rows[0] for i in rows])):
                batched[i] = out
    result = {"artifact": args.artifact, "int8_scales": args.int8_scales, "task": predictor.task, "rows": len(texts), "batch": args.batch,
              "dynamic_int8": "DynamicQuantizeLinear" in ops or "DynamicQuantizeMatMul" in ops,
              "load_average": os.getloadavg()}
    if predictor.task == "text-classification":
        a = np.array([o.argmax() for o in alone])
        b = np.array([batched[i].argmax() for i in range(len(texts))])
        diff = np.array([np.abs(alone[i] - batched[i]).max() for i in range(len(texts))])
        result.update(label_agreement=float((a == b).mean()), flips=int((a != b).sum()),
                      max_logit_diff=float(diff.max()), median_logit_diff=float(np.median(diff)))
    else:
        ea = np.stack([predictor.finish(p, [o]) for p, o in zip(prepared, alone)])
        eb = np.stack([predictor.finish(prepared[i], [batched[i]]) for i in range(len(texts))])
        cos = (ea * eb).sum(1) / np.linalg.norm(ea, axis=1) / np.linalg.norm(eb, axis=1)
        result.update(cosine_min=float(cos.min()), cosine_mean=float(cos.mean()),
                      below_0999=int((cos < 0.999).sum()))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
