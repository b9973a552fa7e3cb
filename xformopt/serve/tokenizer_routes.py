"""TEI's ``/tokenize`` and ``/decode``, for every encoder artifact.

They read the artifact's ``tokenizer.json`` through their own ``tokenizers.Tokenizer`` (padding and
truncation off), not the predictor's: the batch worker's tokenizer changes its truncation settings per
call, and a fast tokenizer used from two threads at once can fail ("Already borrowed"). These routes run
on the event loop, one at a time, and take microseconds.

``/tokenize`` answers TEI's tokens: ``{id, text, special, start, stop}``, ``start``/``stop`` byte
offsets into the (prompted) text, ``None`` for special tokens, whose ``text`` is the token itself.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI

from xformopt.serve import schemas
from xformopt.serve.embedding_routes import read_prompts
from xformopt.serve.replies import HTTPFailure, check_inputs, json_response

ROUTES = ("/tokenize", "/decode")


def open_tokenizer(artifact: str | Path):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(artifact) / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def tokens_of(tokenizer, text: str, add_special_tokens: bool) -> list[dict]:
    encoding = tokenizer.encode(text, add_special_tokens=add_special_tokens)
    out = []
    for token_id, (start, stop), special, token in zip(encoding.ids, encoding.offsets,
                                                        encoding.special_tokens_mask, encoding.tokens):
        if special:
            out.append({"id": token_id, "text": token, "special": True, "start": None, "stop": None})
        else:  # Python's offsets count characters; TEI's count UTF-8 bytes
            out.append({"id": token_id, "text": text[start:stop], "special": False,
                        "start": len(text[:start].encode()), "stop": len(text[:stop].encode())})
    return out


def add_routes(app: FastAPI, config) -> set[str]:
    tokenizer = open_tokenizer(config.artifact)
    prompts = read_prompts(config.artifact)
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)

    @app.post("/tokenize", summary="text-embeddings-inference: the tokens of each text, [[{id, text, special, "
                                   "start, stop}]]")
    async def tokenize(body: schemas.TokenizeRequest):
        texts = [body.inputs] if isinstance(body.inputs, str) else list(body.inputs)
        check_inputs(texts, config.max_inputs)
        if body.prompt_name is not None:
            if body.prompt_name not in prompts:
                raise HTTPFailure(422, f"prompt_name {body.prompt_name!r} is not one of the model's prompts "
                                  f"({', '.join(prompts) or 'none'})", "Validation")
            texts = [prompts[body.prompt_name] + t for t in texts]
        return json_response([tokens_of(tokenizer, t, body.add_special_tokens) for t in texts])

    @app.post("/decode", summary="text-embeddings-inference: token ids back to text, [str]")
    async def decode(body: schemas.DecodeRequest):
        batch = body.ids if body.ids and isinstance(body.ids[0], list) else [body.ids]  # [] is one empty text
        if len(batch) > config.max_inputs:
            raise HTTPFailure(422, f"{len(batch)} inputs in one request, more than the limit of {config.max_inputs}; "
                              "split the request", "Validation")
        for i, ids in enumerate(batch):
            bad = [t for t in ids if t >= vocab]
            if bad:
                raise HTTPFailure(422, f"ids {i}: token id {bad[0]} is outside the vocabulary of {vocab}", "Tokenizer")
        return json_response([tokenizer.decode(ids, skip_special_tokens=body.skip_special_tokens) for ids in batch])

    return set(ROUTES)
