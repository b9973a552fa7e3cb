"""A decoder artifact ready to generate text: prompt in, continuation out (``xformopt generate`` and
``xformopt.load(artifact).generate``), on the loop of :mod:`.generate` and the ONNX Runtime step runner."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from xformopt import models
from xformopt.decoder.generate import (
    Generation,
    Sampling,
    StopStrings,
    chat_text,
    context_window,
    encode_prompt,
    eos_token_ids,
)
from xformopt.decoder.generate import generate as run_generation
from xformopt.errors import InputError
from xformopt.measure.host import usable_cpus
from xformopt.models import load_tokenizer
from xformopt.models.validate import check_threads
from xformopt.runtime.decoder import OrtDecoder

_log = logging.getLogger(__name__)


def open_decoder(artifact: Path):
    """The artifact's spec, checked: an ONNX decoder with its tokenizer and config."""

    path = Path(artifact)
    if not path.exists():
        raise InputError(f"artifact not found: {path}; pass the -o folder of `xformopt export/fuse/quantize/optimize`")
    if not path.is_dir():
        raise InputError(f"{path} is a file; pass the artifact directory that holds model.onnx")
    if not (path / "model.onnx").is_file():
        raise InputError(f"{path} has no model.onnx; export the decoder first: xformopt export MODEL -o NEW_DIR, then generate from NEW_DIR")
    spec = models.describe(path)
    spec.task_def.refuse("generate", f"{path} is a {spec.model_type} {spec.task} artifact")
    return spec


def sampling_of(do_sample: bool | None = None, temperature: float | None = None, top_k: int | None = None,
                top_p: float | None = None, seed: int = 0) -> Sampling:
    """Greedy unless asked to sample: ``do_sample=True``, or any of temperature / top-k / top-p given."""
    sampled = any(v is not None for v in (temperature, top_k, top_p))
    if do_sample is False and sampled:
        raise InputError("greedy decoding cannot be combined with temperature/top-k/top-p; choose one")
    return Sampling(do_sample=bool(do_sample) or sampled, temperature=1.0 if temperature is None else temperature,
                    top_k=top_k, top_p=top_p, seed=seed)


def check_prompt(prompt: str | None, chat: str | None, system: str | None) -> None:
    """One of a prompt to continue and a chat message to answer; a system prompt only with a chat."""
    if (prompt is None) == (chat is None):
        raise InputError('give a PROMPT to continue or --chat "message" to answer (one of the two)')
    if system is not None and chat is None:
        raise InputError("--system goes with --chat; put it into the PROMPT for plain continuation")


@dataclass
class TextGeneration:
    """One continuation: its text and the token-level record (ids, time to first token, per-token times)."""

    prompt: str  # the text the model continued: for a chat, the chat template applied to the messages
    text: str
    generation: Generation
    decoding: str  # Sampling.describe(): "greedy" or "sampling (temperature 0.8, ..., seed 7)"
    chat: dict | None = None  # {"user", "system"} when the prompt came from the chat template
    stop_string: str | None = None  # the stop string that ended it, if one did

    def to_dict(self) -> dict:
        g = self.generation
        return {"prompt": self.prompt, **(self.chat or {}),
                **({"stop_string": self.stop_string} if self.stop_string is not None else {}),
                "prompt_ids": g.prompt_ids, "text": self.text, "new_ids": g.new_ids,
                "decoding": self.decoding, "use_cache": g.use_cache, "stopped": g.stopped,
                "ttft_ms": g.first_token_s * 1000, "per_token_ms": [s * 1000 for s in g.step_s],
                "tokens_per_s": g.tokens_per_s}


class TextGenerator:
    """A decoder artifact's tokenizer and ONNX Runtime session, opened once for many prompts."""

    task = "text-generation"

    def __init__(self, artifact: Path, *, threads: int | None = None, io_binding: bool = True,
                 spinning: bool = True):

        check_threads(threads)
        self.spec = open_decoder(artifact)
        self.path = self.spec.path
        self.tokenizer = load_tokenizer(self.spec.path, self.spec.trust_remote_code)
        self.threads = threads or usable_cpus()
        self.io_binding = io_binding
        self.runner = OrtDecoder(self.spec.path, threads=self.threads, io_binding=io_binding, spinning=spinning)

    def generate(self, prompt: str | None = None, max_new_tokens: int = 32, *, chat: str | None = None,
                 system: str | None = None, stop: list[str] | None = None, do_sample: bool | None = None,
                 temperature: float | None = None, top_k: int | None = None, top_p: float | None = None,
                 seed: int = 0, use_cache: bool = True, stop_at_eos: bool = True,
                 on_token: Callable[[int], None] | None = None) -> TextGeneration:
        """Continue ``prompt``, or answer ``chat`` (one user message, with an optional ``system`` prompt,
        through the model's own chat template), by up to ``max_new_tokens`` tokens: greedy unless sampling
        is asked for (a seed gives the same text every run); it stops at EOS and at any of ``stop``, as
        transformers' ``stop_strings`` does. ``on_token(id)`` is called as each token arrives. An empty
        prompt, both or neither of prompt and chat, or a prompt that does not fit the context window with
        the new tokens is an InputError."""
        sampling = sampling_of(do_sample, temperature, top_k, top_p, seed)
        check_prompt(prompt, chat, system)
        text_in = chat_text(self.tokenizer, chat, system) if chat is not None else prompt
        ids = encode_prompt(self.tokenizer, text_in, max_new_tokens, context_window(self.spec.path),
                            templated=chat is not None)
        stopper = StopStrings(self.tokenizer, list(stop)) if stop else None
        _log.info(f"{self.spec.model_type} from {self.spec.path}: prompt {len(ids)} tokens, {sampling.describe()}, "
                 f"{'KV cache' if use_cache else 'no cache'}, {self.threads} threads")
        result = run_generation(self.runner, ids, max_new_tokens, sampling,
                                eos_token_id=eos_token_ids(self.spec.path, self.tokenizer) if stop_at_eos else None,
                                use_cache=use_cache, on_token=on_token, stop=stopper)
        return TextGeneration(text_in, self.tokenizer.decode(result.new_ids, skip_special_tokens=True), result,
                              sampling.describe(), {"chat": chat, "system": system} if chat is not None else None,
                              stopper.hit if stopper is not None else None)

    def embed(self, texts, batch_size: int = 32, normalize=None):
        raise InputError(f"{self.path} is a text-generation artifact: it generates (.generate), it does not embed")

    def predict(self, inputs, batch_size: int = 32):
        raise InputError(f"{self.path} is a text-generation artifact: use .generate(prompt) instead of .predict")
