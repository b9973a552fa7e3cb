"""What the encoder routes share: their failures as TEI's status codes and error bodies, the input list of
a request, JSON answers, and the scheduler call that turns its refusals into HTTP answers.

TEI's faults and codes (``router/src/lib.rs``, ``ErrorType``): an empty batch 400 ``Empty``, a bad input
or too many of them 422 ``Validation`` (``Tokenizer`` for ids the tokenizer cannot read), a full queue 429
``Overloaded``, a failed inference 424 ``Backend``, not ready 503 ``Unhealthy``. The body is
``{"error", "error_type"}``; on the OpenAI routes ``{"message", "code", "type"}``, as TEI writes it there.
A request past its deadline (TEI has none) is 504 ``Timeout``.
"""

from __future__ import annotations

import base64

import numpy as np
import orjson
from fastapi.responses import JSONResponse, Response

from xformopt.errors import InputError
from xformopt.serve.scheduler import BatchFailed, DeadlineExceeded, Overloaded
from xformopt.tasks.heads import is_token_ids

OPENAI_PATHS = ("/v1/embeddings", "/embeddings")


class HTTPFailure(Exception):
    def __init__(self, status: int, message: str, kind: str, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.headers = status, message, kind, headers or {}


def error_response(status: int, message: str, kind: str, headers: dict | None = None,
                   path: str = "") -> JSONResponse:
    body = ({"message": message, "code": status, "type": kind} if path in OPENAI_PATHS
            else {"error": message, "error_type": kind})
    return JSONResponse(body, status_code=status, headers=headers)


def json_response(content) -> Response:
    """A JSON answer; orjson writes numpy float32 arrays directly (json.dumps of their .tolist() cost
    0.4 ms per 384-float embedding, a large share of a request's CPU)."""
    return Response(orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY), media_type="application/json")


def inputs_of(value) -> tuple[list, bool]:
    """(inputs, whether the request sent one input rather than a list). A list of token ids is one
    input, as in TEI: ``[101, 102]`` is one, ``[[101, 102]]`` a batch of one."""
    if isinstance(value, list) and not is_token_ids(value):
        return list(value), False
    return [value], True


def truncation(truncate: bool, direction: str = "right") -> bool | str:
    """The predictor's ``truncate`` for TEI's pair of fields: False, True (cut the end) or "left" (the start)."""
    return "left" if truncate and direction.lower() == "left" else truncate


def check_inputs(items: list, limit: int, what: str = "inputs") -> None:
    if not items:
        raise HTTPFailure(400, f"`{what}` cannot be empty; send at least one input", "Empty")
    if len(items) > limit:
        raise HTTPFailure(422, f"{len(items)} inputs in one request, more than the limit of {limit}; split the request",
                          "Validation")
    for i, item in enumerate(items):
        texts = item if isinstance(item, (list, tuple)) else [item]
        if any(isinstance(t, str) and not t.strip() for t in texts):
            raise HTTPFailure(422, f"input {i} is empty; send non-empty texts", "Validation")
        if isinstance(item, list) and not item:
            raise HTTPFailure(422, f"input {i} is an empty list of token ids", "Validation")


def encode_vector(vector: np.ndarray, fmt: str):
    if fmt == "base64":  # what the OpenAI client decodes: little-endian float32 bytes
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return np.ascontiguousarray(vector, dtype=np.float32)  # orjson writes it as a list of floats


def runner(state: dict):
    """``run(items, **options)``: the items through the encoder scheduler, its refusals as HTTP answers."""

    async def run(items: list, **options) -> list[tuple]:
        scheduler = state["scheduler"]
        if scheduler is None or not state["ready"]:
            raise HTTPFailure(503, "the model is still loading; retry shortly", "Unhealthy", {"Retry-After": "1"})
        try:
            return await scheduler.submit(items, **options)
        except Overloaded as exc:
            raise HTTPFailure(429, str(exc), "Overloaded", {"Retry-After": str(exc.retry_after)}) from None
        except DeadlineExceeded as exc:
            raise HTTPFailure(504, f"request deadline passed: {exc}", "Timeout") from None
        except InputError as exc:
            raise HTTPFailure(422, exc.message, "Validation") from None
        except BatchFailed as exc:
            raise HTTPFailure(424, str(exc), "Backend") from None

    return run
