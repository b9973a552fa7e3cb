"""Request bodies of the encoder tasks' ``POST /predict`` (pydantic: they validate every request and are
the OpenAPI schema). Each task names its body in its ``serving`` (xformopt/tasks/heads.py, ``Serving``);
only the server imports this module."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

Text = StrictStr  # numbers and nulls are refused, not turned into text
Pair = tuple[Text, Text]
# TEI's truncation_direction, in both of its spellings: where an over-long input is cut (the predictor's
# truncate="left" cuts the start)
Direction = Literal["right", "Right", "left", "Left"]
# huggingface_hub's InferenceClient always sends a "parameters" object (function_to_apply, top_k,
# aggregation_strategy); TEI ignores every field it does not know, these routes refuse unknown fields but
# accept this one and ignore it, as TEI does
Parameters = Field(None, description="What huggingface_hub's InferenceClient sends; accepted and ignored, as in TEI.")


class ClassifyRequest(BaseModel):
    """TEI ``POST /predict`` for text-classification. As in TEI, a list of exactly two texts is one
    (text, text_pair) pair; a batch of pairs is a list of two-text lists."""

    model_config = ConfigDict(extra="forbid")
    inputs: Text | Pair | list[Text | Pair]
    raw_scores: StrictBool = Field(False, description="Logits instead of probabilities.")
    truncate: StrictBool = True
    truncation_direction: Direction = "right"
    parameters: dict[str, Any] | None = Parameters


class TokensRequest(BaseModel):
    """``POST /predict`` for token-classification: entities as transformers' pipeline returns them."""

    model_config = ConfigDict(extra="forbid")
    inputs: Text | list[Text]
    truncate: StrictBool = True
    parameters: dict[str, Any] | None = Parameters


class Question(BaseModel):
    model_config = ConfigDict(extra="forbid")
    question: Text
    context: Text


class AnswerRequest(BaseModel):
    """``POST /predict`` for question-answering: {answer, score, start, end} per question."""

    model_config = ConfigDict(extra="forbid")
    inputs: Question | list[Question]
