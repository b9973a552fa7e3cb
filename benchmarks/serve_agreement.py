"""Served answers against the artifact's own unbatched answers, under concurrent load.

    python benchmarks/serve_agreement.py labels ARTIFACT URL [--rows 2014] [--in-flight 64]  # a classifier
    python benchmarks/serve_agreement.py openai ARTIFACT URL [--rows 256]      # an embedder, via the OpenAI client

``labels``: every held-out text as a single-text request, --in-flight at a time (the server batches
them as they come); each served label compared with the label of the same text run alone, both as
served (per-token INT8) and with the artifact's graph as exported. ``openai``: the OpenAI
Python client (base URL pointed at the server) from 32 threads; cosine of each embedding to the same
text embedded alone (the done-when: >= 0.999).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np


async def fire(url: str, texts: list[str], in_flight: int) -> list:
    import aiohttp

    slots = asyncio.Semaphore(in_flight)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=in_flight)) as session:
        async def one(text):
            async with slots, session.post(f"{url}/predict", json={"inputs": [text]}) as reply:
                return reply.status, await reply.json()
        return await asyncio.gather(*(one(t) for t in texts))


def labels(predictor, url: str, texts: list[str], in_flight: int, exported=None) -> dict:
    """Served labels against the same artifact's unbatched labels: as served (the per-token graph, each
    text alone) and as exported (the artifact's graph unchanged, each text alone)."""
    replies = asyncio.run(fire(url, texts, in_flight))
    served = [body[0][0]["label"] if status == 200 else None for status, body in replies]
    out = {"ok": sum(s == 200 for s, _ in replies), "in_flight": in_flight}
    for name, reference in (("served_alone", predictor), ("exported_alone", exported)):
        if reference is None:
            continue
        alone = [answer[0]["label"] for answer in reference.predict(texts, batch_size=1)]
        same = np.array([a == b for a, b in zip(served, alone) if a is not None])
        out[name] = {"label_agreement": round(float(same.mean()), 5), "differ": int((~same).sum()),
                     "differ_rows": [i for i, (a, b) in enumerate(zip(served, alone)) if a is not None and a != b]}
    return out


def openai(predictor, url: str, texts: list[str]) -> dict:
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key=os.environ.get("XFORMOPT_KEY", "none"))
    with ThreadPoolExecutor(32) as pool:
        served = np.array(list(pool.map(lambda t: client.embeddings.create(input=t, model="m").data[0].embedding, texts)))
    alone = predictor.embed(texts, batch_size=1)
    cos = (served * alone).sum(1) / np.linalg.norm(served, axis=1) / np.linalg.norm(alone, axis=1)
    return {"cosine_min": float(cos.min()), "cosine_mean": float(cos.mean()), "below_0999": int((cos < 0.999).sum())}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("check", choices=("labels", "openai"))
    parser.add_argument("artifact")
    parser.add_argument("url")
    parser.add_argument("--rows", type=int, default=2014)
    parser.add_argument("--in-flight", type=int, default=64, help="labels: requests in flight at once")
    parser.add_argument("--int8-scales", default="per-token", help="as the server was started")
    args = parser.parse_args()
    from xformopt.resources import vader_split_path
    from xformopt.runtime.predictor import load_predictor

    texts = [json.loads(line)["text"] for line in vader_split_path("test").read_text(encoding="utf-8").splitlines()][:args.rows]
    predictor = load_predictor(args.artifact, 2, args.int8_scales)
    if args.check == "labels":
        result = labels(predictor, args.url, texts, args.in_flight, load_predictor(args.artifact, 2, "per-tensor"))
    else:
        result = openai(predictor, args.url, texts)
    print(json.dumps({"check": args.check, "rows": len(texts), **result, "load_average": os.getloadavg()}))


if __name__ == "__main__":
    main()
