"""The routes of a feature-extraction artifact, as text-embeddings-inference lays them out:
``/embed`` (its main route, also ``POST /`` and ``/invocations``), OpenAI's ``/v1/embeddings`` and
``/embeddings``, ``/embed_all`` (every token's vector) and ``/similarity`` (cosines to a source sentence).

Inputs are texts or token-id lists; ``dimensions`` keeps a vector's first N values and normalises after
the cut (Matryoshka, as TEI does it); ``prompt_name`` puts one of the model's sentence-transformers prompts
(``config_sentence_transformers.json``) before each text.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from fastapi import FastAPI

from xformopt.serve import schemas
from xformopt.serve.replies import HTTPFailure, check_inputs, encode_vector, inputs_of, json_response, truncation

ROUTES = ("/embed", "/v1/embeddings", "/embeddings", "/embed_all", "/similarity")


def read_prompts(artifact: str | Path) -> dict[str, str]:
    """The model's named prompts (sentence-transformers' ``prompts``), {} when it has none."""
    try:
        config = json.loads((Path(artifact) / "config_sentence_transformers.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    prompts = config.get("prompts") if isinstance(config, dict) else None
    return {k: v for k, v in prompts.items() if isinstance(v, str)} if isinstance(prompts, dict) else {}


class Inputs:
    """A request's inputs checked as TEI checks them, the prompt applied, before any work."""

    def __init__(self, config, width: int):
        self.limit, self.width = config.max_inputs, width
        self.prompts = read_prompts(config.artifact)

    def items(self, value, what: str = "inputs", prompt_name: str | None = None) -> tuple[list, bool]:
        items, single = inputs_of(value)
        check_inputs(items, self.limit, what)
        if prompt_name is not None:
            if prompt_name not in self.prompts:
                known = ", ".join(self.prompts) or "none"
                raise HTTPFailure(422, f"prompt_name {prompt_name!r} is not one of the model's prompts ({known})",
                                  "Validation")
            items = [self.prompts[prompt_name] + i if isinstance(i, str) else i for i in items]
        return items, single

    def dimensions(self, value: int | None) -> int | None:
        """TEI's checks: positive, at most the model's width."""
        if value is None:
            return None
        if value <= 0:
            raise HTTPFailure(422, "`dimensions` should be positive", "Validation")
        if value > self.width:
            raise HTTPFailure(422, f"`dimensions` {value} is more than the model's {self.width}", "Validation")
        return value


def add_routes(app: FastAPI, config, spec, run) -> set[str]:
    """Every embedding route on ``app``; ``run`` is the scheduler call (xformopt.serve.replies.runner)."""
    model_name = config.model_name or Path(config.artifact).name
    inputs = Inputs(config, spec.hidden_size)

    @app.post("/v1/embeddings", summary="OpenAI-compatible embeddings")
    @app.post("/embeddings", summary="OpenAI-compatible embeddings (TEI's path without /v1)")
    async def openai_embeddings(body: schemas.OpenAIEmbeddingRequest):
        items, _ = inputs.items(body.input, "input")
        cut = inputs.dimensions(body.dimensions)
        # OpenAI's shortened vectors are unit vectors; without dimensions, as the model's modules say
        answers = await run(items, truncate=True, normalize=None if cut is None else True, dimensions=cut)
        tokens = sum(t for _, t in answers)
        data = [{"object": "embedding", "index": i, "embedding": encode_vector(v, body.encoding_format)}
                for i, (v, _) in enumerate(answers)]
        return json_response({"object": "list", "data": data, "model": body.model or model_name,
                              "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    @app.post("/embed", summary="text-embeddings-inference embeddings: [[float]]")
    async def embed(body: schemas.EmbedRequest):
        items, _ = inputs.items(body.inputs, "inputs", body.prompt_name)
        cut = inputs.dimensions(body.dimensions)
        answers = await run(items, truncate=truncation(body.truncate, body.truncation_direction),
                            normalize=body.normalize, dimensions=cut)
        return json_response([np.asarray(v, dtype=np.float32) for v, _ in answers])

    @app.post("/embed_all", summary="text-embeddings-inference: every token's vector, [[[float]]]")
    async def embed_all(body: schemas.EmbedAllRequest):
        items, _ = inputs.items(body.inputs, "inputs", body.prompt_name)
        answers = await run(items, truncate=truncation(body.truncate, body.truncation_direction), cache=False,
                            all_tokens=True)
        return json_response([np.asarray(v, dtype=np.float32) for v, _ in answers])

    @app.post("/similarity", summary="text-embeddings-inference: cosine of the source sentence with each sentence")
    async def similarity(body: schemas.SimilarityRequest):
        options = body.parameters or schemas.SimilarityParameters()
        if not body.inputs.sentences:
            raise HTTPFailure(400, "`inputs.sentences` cannot be empty", "Empty")
        items, _ = inputs.items([body.inputs.source_sentence, *body.inputs.sentences], "inputs.sentences",
                                options.prompt_name)
        truncate = truncation(options.truncate, options.truncation_direction)
        vectors = np.stack([v for v, _ in await run(items, truncate=truncate, normalize=True)])
        return json_response([float(s) for s in vectors[1:] @ vectors[0]])

    return set(ROUTES)
