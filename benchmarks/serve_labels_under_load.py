"""Served labels against the artifact's unbatched labels under load: every held-out text sent at once
as a single-text request (the server batches them as they come), each served label compared with the
label of the same text run alone.

    python benchmarks/serve_labels_under_load.py ARTIFACT URL [--rows 2014] [--int8-scales per-token]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os

import numpy as np


async def fire(url: str, texts: list[str]) -> list:
    import aiohttp

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256)) as session:
        async def one(text):
            async with session.post(f"{url}/predict", json={"inputs": [text]}) as reply:
                return reply.status, await reply.json()
        return await asyncio.gather(*(one(t) for t in texts))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("artifact")
    parser.add_argument("url")
    parser.add_argument("--rows", type=int, default=2014)
    parser.add_argument("--int8-scales", default="per-token")
    args = parser.parse_args()
    from xformopt.resources import vader_split_path
    from xformopt.runtime.predictor import load_predictor

    texts = [json.loads(line)["text"] for line in open(vader_split_path("test"), encoding="utf-8")][:args.rows]
    replies = asyncio.run(fire(args.url, texts))
    statuses = [s for s, _ in replies]
    served = [body[0][0]["label"] if s == 200 else None for s, body in replies]
    predictor = load_predictor(args.artifact, 2, args.int8_scales)
    alone = [answer[0]["label"] for answer in predictor.predict(texts, batch_size=1)]
    same = np.array([a == b for a, b in zip(served, alone) if a is not None])
    print(json.dumps({"rows": len(texts), "ok": statuses.count(200), "label_agreement": float(same.mean()),
                      "differ": int((~same).sum()), "load_average": os.getloadavg()}))


if __name__ == "__main__":
    main()
