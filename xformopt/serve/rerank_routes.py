"""TEI's ``POST /rerank`` for a text-ranking artifact (a cross-encoder): one (query, passage) pair per text,
batched with every other request by the scheduler like any input, answered as TEI does: ``[{index, score,
text?}]`` sorted by score, best first (``raw_scores``: the logit, else its sigmoid)."""

from __future__ import annotations

from fastapi import FastAPI

from xformopt.serve import schemas
from xformopt.serve.replies import HTTPFailure, check_inputs, json_response, truncation

ROUTES = ("/rerank",)


def add_routes(app: FastAPI, config, spec, run) -> set[str]:
    @app.post("/rerank", summary="text-embeddings-inference rerank: [{index, score, text?}], best first")
    async def rerank(body: schemas.RerankRequest):
        if not body.texts:
            raise HTTPFailure(400, "`texts` cannot be empty", "Empty")
        items = [(body.query, text) for text in body.texts]
        check_inputs(items, config.max_inputs, "texts")
        answers = await run(items, truncate=truncation(body.truncate, body.truncation_direction),
                            raw_scores=body.raw_scores)
        ranks = [{"index": i, "score": answer[0]["score"], **({"text": text} if body.return_text else {})}
                 for i, ((answer, _), text) in enumerate(zip(answers, body.texts))]
        return json_response(sorted(ranks, key=lambda r: -r["score"]))

    return set(ROUTES)
