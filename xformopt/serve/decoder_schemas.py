"""Request bodies of the decoder routes, as OpenAI's chat completions and completions APIs take them
(the fields this server honours; others are refused by name, not silently ignored)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, field_validator

MAX_STOP = 4  # OpenAI's limit on stop strings


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: StrictStr


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | list[TextPart] | None = None
    name: StrictStr | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: StrictBool = False


class _Generation(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: StrictStr | None = Field(None, description="Echoed back; the server serves one model.")
    max_tokens: StrictInt | None = Field(None, ge=1, description="New tokens at most [default: the server's "
                                         "--max-new-tokens, capped by the context window].")
    temperature: float | None = Field(None, ge=0, le=2, description="0: greedy; [default: the model's "
                                      "generation_config.json, else 1].")
    top_p: float | None = Field(None, gt=0, le=1)
    seed: StrictInt | None = Field(None, description="Same seed, same prompt, same settings: the same answer, "
                                   "whatever else the server is decoding.")
    stop: StrictStr | list[StrictStr] | None = Field(None, description=f"Up to {MAX_STOP} strings; the answer "
                                                     "ends before the first one (not included).")
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: StrictInt = Field(1, ge=1, le=1, description="One choice per request.")
    user: StrictStr | None = None
    ignore_eos: StrictBool = Field(False, description="Keep going past EOS up to max_tokens (vLLM's and "
                                   "llama.cpp's extension; for benchmarks).")
    presence_penalty: float = Field(0.0, ge=0, le=0, description="Not supported: 0 only.")
    frequency_penalty: float = Field(0.0, ge=0, le=0, description="Not supported: 0 only.")
    logprobs: Literal[False, None] = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, value):
        stops = [value] if isinstance(value, str) else list(value or [])
        if len(stops) > MAX_STOP or any(not s for s in stops):
            raise ValueError(f"give at most {MAX_STOP} non-empty stop strings")
        return stops

    def stop_list(self) -> list[str]:
        return list(self.stop or [])


class ChatCompletionRequest(_Generation):
    """OpenAI ``POST /v1/chat/completions``: the messages through the model's chat template."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(None, ge=1, description="The newer name of max_tokens.")


class CompletionRequest(_Generation):
    """OpenAI ``POST /v1/completions``: continue a prompt (text, one text in a list, or token ids)."""

    prompt: StrictStr | list[StrictStr] | list[StrictInt]
    echo: Literal[False] = False

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value):
        if isinstance(value, list) and value and isinstance(value[0], str) and len(value) != 1:
            raise ValueError("one prompt per request (a list of several texts is not supported)")
        if isinstance(value, list) and not value:
            raise ValueError("the prompt is empty")
        return value
