"""Request bodies, as pydantic models: they validate every request and are the OpenAPI schema, so
/openapi.json cannot drift from what the routes accept. Field names follow the clients users already
have: OpenAI's embeddings API and text-embeddings-inference (TEI, ``router/src/http/types.rs``).

As in TEI, an input is a text or a list of token ids, and a request carries one input or a list of them
(``[101, 2023, 102]`` is one input of three ids; ``[[101, 102], "a text"]`` two inputs)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, StrictBool, StrictInt, StrictStr

from xformopt.tasks.bodies import Direction  # TEI's truncation_direction, both spellings

Text = StrictStr  # numbers and nulls are refused, not turned into text
TokenIds = list[NonNegativeInt]
Inputs = Text | TokenIds | list[Text | TokenIds]


class OpenAIEmbeddingRequest(BaseModel):
    """OpenAI ``POST /v1/embeddings`` (also ``/embeddings``, as TEI serves it)."""

    model_config = ConfigDict(extra="forbid")
    input: Inputs = Field(description="A text, a list of token ids, or a list of either.")
    model: StrictStr | None = Field(None, description="Echoed back; the server serves one model.")
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="base64: each embedding as little-endian float32 bytes, base64-encoded.")
    dimensions: StrictInt | None = Field(None, description="Keep the first N dimensions, then L2-normalise "
                                         "(Matryoshka; the sizes the model was trained for are in /info).")
    user: StrictStr | None = None


class EmbedRequest(BaseModel):
    """TEI ``POST /embed``; the fields huggingface_hub's ``InferenceClient.feature_extraction`` sends."""

    model_config = ConfigDict(extra="forbid")
    inputs: Inputs
    normalize: StrictBool | None = Field(None, description="L2-normalize [default: as the model's "
                                         "sentence-transformers modules say].")
    truncate: StrictBool = Field(True, description="Cut inputs at the model's token limit; false: 422 instead.")
    truncation_direction: Direction = "right"
    prompt_name: StrictStr | None = Field(None, description="A key of the model's sentence-transformers prompts: "
                                          "its text is put before each input.")
    dimensions: StrictInt | None = Field(None, description="Keep the first N dimensions, then normalise (as "
                                         "`normalize` says).")
    encoding_format: Literal["float"] = "float"  # what InferenceClient sends; TEI's /embed answers floats only


class EmbedAllRequest(BaseModel):
    """TEI ``POST /embed_all``: every token's vector, no pooling."""

    model_config = ConfigDict(extra="forbid")
    inputs: Inputs
    truncate: StrictBool = True
    truncation_direction: Direction = "right"
    prompt_name: StrictStr | None = None


class SimilarityInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    source_sentence: Text
    sentences: list[Text]


class SimilarityParameters(BaseModel):
    model_config = ConfigDict(extra="forbid")
    truncate: StrictBool = True
    truncation_direction: Direction = "right"
    prompt_name: StrictStr | None = None


class SimilarityRequest(BaseModel):
    """TEI ``POST /similarity``: the cosine of the source sentence's embedding with each sentence's."""

    model_config = ConfigDict(extra="forbid")
    inputs: SimilarityInput
    parameters: SimilarityParameters | None = None


class TokenizeRequest(BaseModel):
    """TEI ``POST /tokenize``: the tokens of each text, with their byte offsets into it."""

    model_config = ConfigDict(extra="forbid")
    inputs: Text | list[Text]
    add_special_tokens: StrictBool = True
    prompt_name: StrictStr | None = None


class DecodeRequest(BaseModel):
    """TEI ``POST /decode``: token ids back to text."""

    model_config = ConfigDict(extra="forbid")
    ids: TokenIds | list[TokenIds]
    skip_special_tokens: StrictBool = True


class RerankRequest(BaseModel):
    """TEI ``POST /rerank``: the query's passages ordered by the reranker's score, best first."""

    model_config = ConfigDict(extra="forbid")
    query: Text
    texts: list[Text]
    truncate: StrictBool = True
    truncation_direction: Direction = "right"
    raw_scores: StrictBool = Field(False, description="The logit instead of its sigmoid.")
    return_text: StrictBool = Field(False, description="Each passage's text in its rank.")
