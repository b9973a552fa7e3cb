"""The OpenAI Python client against `xformopt serve` (base URL pointed at it): the embeddings it reads
have cosine >= 0.999 to the artifact's own unbatched output. Sends --rows held-out texts as concurrent
single-text requests (so the server batches them), then compares each with the text embedded alone.

    python benchmarks/serve_openai_cosine.py ARTIFACT URL [--rows 256]
"""

from __future__ import annotations

import argparse
import json
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("artifact")
    parser.add_argument("url")
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--int8-scales", default="per-token")
    args = parser.parse_args()
    from openai import OpenAI

    from xformopt.resources import vader_split_path
    from xformopt.runtime.predictor import load_predictor

    texts = [json.loads(line)["text"] for line in open(vader_split_path("test"), encoding="utf-8")][:args.rows]
    client = OpenAI(base_url=f"{args.url}/v1", api_key=os.environ.get("XFORMOPT_KEY", "none"))
    with ThreadPoolExecutor(32) as pool:
        served = np.array(list(pool.map(lambda t: client.embeddings.create(input=t, model="m").data[0].embedding, texts)))
    predictor = load_predictor(args.artifact, 2, args.int8_scales)
    alone = predictor.embed(texts, batch_size=1)
    cos = (served * alone).sum(1) / np.linalg.norm(served, axis=1) / np.linalg.norm(alone, axis=1)
    print(json.dumps({"rows": len(texts), "cosine_min": float(cos.min()), "cosine_mean": float(cos.mean()),
                      "below_0999": int((cos < 0.999).sum()), "load_average": os.getloadavg()}))


if __name__ == "__main__":
    main()
