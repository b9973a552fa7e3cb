"""A tiny served decoder (tests/toy_decoder.py's Llama with grouped-query attention, exported by the genai
builder and quantized to int4, a chat template added) and an engine with a known step time."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx

CONTEXT = 1024  # long enough for a stream that outlasts a drain
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def build_served_decoder(root: Path, texts: list[str]) -> Path:
    """train -> export (GroupQueryAttention) -> int4; the int4 folder, with a chat template."""
    import tiny_decoders
    from helpers import make_ctx, run_pass
    from toy_decoder import build_decoder

    base = tiny_decoders.make_config("llama")

    def config(vocab_size, eos_id):
        made = base(vocab_size, eos_id)
        made.max_position_embeddings = CONTEXT
        return made

    model = build_decoder(root / "model", "llama", make_config=config, context=CONTEXT, train_steps=60, train_batch=8)
    ctx = make_ctx(model, texts)
    run_pass("export", ctx, model, root / "e")
    run_pass("int4", ctx, root / "e", root / "q")
    (root / "q" / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return root / "q"


class SlowEngine:
    """The real BatchDecoder, each decode step taking at least ``step_s`` (a known service time)."""

    def __init__(self, inner, step_s: float):
        self.inner, self.step_s = inner, step_s

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def decode(self, tokens):
        started = time.perf_counter()
        out = self.inner.decode(tokens)
        time.sleep(max(0.0, self.step_s - (time.perf_counter() - started)))
        return out


def slow_engine_factory(step_s: float, engine=None):
    """Slowed ``engine`` (a class with BatchDecoder's constructor; default BatchDecoder)."""
    from xformopt.runtime.batch_decoder import BatchDecoder

    def factory(path, threads, max_kv_tokens, max_rows):
        return SlowEngine((engine or BatchDecoder)(path, threads, max_kv_tokens, max_rows), step_s)

    return factory


def sse_events(response: httpx.Response):
    """The JSON payloads of a server-sent-event stream, then the string "[DONE]"."""
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            yield data if data == "[DONE]" else json.loads(data)
