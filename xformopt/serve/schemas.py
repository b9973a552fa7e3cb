"""Request bodies, as pydantic models: they validate every request and are the OpenAPI schema, so
/openapi.json cannot drift from what the routes accept. Field names follow the clients users already
have: OpenAI's embeddings API and text-embeddings-inference (TEI)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

Text = StrictStr  # numbers and nulls are refused, not turned into text


class OpenAIEmbeddingRequest(BaseModel):
    """OpenAI ``POST /v1/embeddings``."""

    model_config = ConfigDict(extra="forbid")
    input: Text | list[Text] = Field(description="A text or a list of texts (token-id arrays are not accepted).")
    model: StrictStr | None = Field(None, description="Echoed back; the server serves one model.")
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="base64: each embedding as little-endian float32 bytes, base64-encoded.")
    dimensions: int | None = Field(None, description="Must equal the model's width when given.")
    user: StrictStr | None = None


class EmbedRequest(BaseModel):
    """TEI ``POST /embed``."""

    model_config = ConfigDict(extra="forbid")
    inputs: Text | list[Text]
    normalize: StrictBool | None = Field(None, description="L2-normalize [default: as the model's "
                                         "sentence-transformers modules say].")
    truncate: StrictBool = Field(True, description="Cut inputs at the model's token limit; false: 422 instead.")
