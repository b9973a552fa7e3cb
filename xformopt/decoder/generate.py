"""The generation loop: greedy or sampled, with or without the KV cache, timed per token.

Sampling uses transformers' own logits warpers (temperature, then top-k, then top-p, the order
``generate`` applies them) and a seeded ``torch.Generator``, so a seed gives the same tokens on every
run and every runner. Prompts are checked before anything runs: an empty prompt or one that does not
fit the context window with the requested new tokens is an :class:`InputError` naming the fix.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from xformopt.errors import InputError
from xformopt.models import position_limit


@dataclass(frozen=True)
class Sampling:
    """Greedy when ``do_sample`` is false; otherwise temperature / top-k / top-p with a seed."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0

    def __post_init__(self):
        if self.temperature <= 0:
            raise InputError(f"--temperature must be > 0 (got {self.temperature}); use --greedy for deterministic argmax decoding")
        if self.top_k is not None and self.top_k < 1:
            raise InputError(f"--top-k must be >= 1 (got {self.top_k})")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise InputError(f"--top-p must be in (0, 1] (got {self.top_p})")

    def describe(self) -> str:
        if not self.do_sample:
            return "greedy"
        parts = [f"temperature {self.temperature:g}"]
        if self.top_k:
            parts.append(f"top-k {self.top_k}")
        if self.top_p is not None and self.top_p < 1:
            parts.append(f"top-p {self.top_p:g}")
        return "sampling (" + ", ".join(parts) + f", seed {self.seed})"


class TokenPicker:
    """Next token from the last position's logits: argmax, or a seeded sample after the warpers."""

    def __init__(self, sampling: Sampling):
        self.sampling = sampling
        self._warpers = None
        if sampling.do_sample:
            import torch
            from transformers import (
                LogitsProcessorList,
                TemperatureLogitsWarper,
                TopKLogitsWarper,
                TopPLogitsWarper,
            )

            warpers = LogitsProcessorList()
            if sampling.temperature != 1.0:
                warpers.append(TemperatureLogitsWarper(sampling.temperature))
            if sampling.top_k:
                warpers.append(TopKLogitsWarper(top_k=sampling.top_k))
            if sampling.top_p is not None and sampling.top_p < 1.0:
                warpers.append(TopPLogitsWarper(top_p=sampling.top_p))
            self._warpers = warpers
            self._torch = torch
            self._generator = torch.Generator().manual_seed(int(sampling.seed))

    def __call__(self, sequence: np.ndarray, last_logits: np.ndarray) -> int:
        if self._warpers is None:
            return int(np.argmax(last_logits))
        torch = self._torch
        scores = self._warpers(torch.from_numpy(sequence[None].astype(np.int64)),
                               torch.from_numpy(np.ascontiguousarray(last_logits, dtype=np.float32))[None])
        probs = torch.softmax(scores, dim=-1)
        return int(torch.multinomial(probs, 1, generator=self._generator)[0, 0])


@dataclass
class Generation:
    """One generated sequence and how long each part took (seconds)."""

    prompt_ids: list[int]
    new_ids: list[int]
    first_token_s: float  # time to first token: the prompt step and the first pick
    step_s: list[float] = field(default_factory=list)  # each later token
    stopped: str = "max_new_tokens"
    use_cache: bool = True

    @property
    def total_s(self) -> float:
        return self.first_token_s + sum(self.step_s)

    @property
    def tokens_per_s(self) -> float:
        return len(self.new_ids) / self.total_s if self.total_s > 0 else float("inf")

    def to_dict(self) -> dict:
        return {**asdict(self), "total_s": self.total_s, "tokens_per_s": self.tokens_per_s}


def generate(
    runner,
    prompt_ids: list[int],
    max_new_tokens: int,
    sampling: Sampling = Sampling(),
    *,
    eos_token_id: int | list[int] | None = None,
    use_cache: bool = True,
    on_token: Callable[[int], None] | None = None,
    stop: Callable[[list[int]], bool] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Generation:
    """Generate up to ``max_new_tokens`` after ``prompt_ids`` (batch 1) with ``runner``
    (:class:`~xformopt.runtime.decoder.OrtDecoder` or ``TorchDecoder``).

    With the cache, step 0 runs the prompt and each later step one token against the cached keys
    and values; without it, each step runs the whole sequence so far. Stops early at
    ``eos_token_id`` (pass None to always produce ``max_new_tokens``), or when ``stop`` (given the
    new ids so far, e.g. a :class:`StopStrings`) says so."""
    if max_new_tokens < 1:
        raise InputError(f"--max-new-tokens must be at least 1 (got {max_new_tokens})")
    eos = set([eos_token_id] if isinstance(eos_token_id, int) else (eos_token_id or []))
    pick = TokenPicker(sampling)
    sequence = np.asarray(prompt_ids, dtype=np.int64)
    new: list[int] = []
    steps: list[float] = []
    started = clock()
    logits, state = runner.forward(sequence[None], None, use_cache=use_cache, last_only=True)
    token = pick(sequence, logits[0, -1])
    first = clock() - started
    stopped = "max_new_tokens"
    while True:
        new.append(token)
        sequence = np.append(sequence, token)
        if on_token is not None:
            on_token(token)
        if token in eos:
            stopped = "eos"
            break
        if stop is not None and stop(new):
            stopped = "stop_string"
            break
        if len(new) >= max_new_tokens:
            break
        started = clock()
        if use_cache:
            logits, state = runner.forward(sequence[None, -1:], state, last_only=True)
        else:
            logits, state = runner.forward(sequence[None], None, use_cache=False, last_only=True)
        token = pick(sequence, logits[0, -1])
        steps.append(clock() - started)
    return Generation([int(t) for t in prompt_ids], new, first, steps, stopped, use_cache)


class StopStrings:
    """transformers' ``stop_strings``: stop once the decoded continuation contains one of them (the
    token that completes it is kept, as ``generate`` keeps it)."""

    def __init__(self, tokenizer, strings: list[str]):
        if any(not s for s in strings):
            raise InputError("--stop takes a non-empty string")
        self.tokenizer, self.strings = tokenizer, list(strings)
        self.hit: str | None = None

    def __call__(self, new_ids: list[int]) -> bool:
        text = self.tokenizer.decode(new_ids, skip_special_tokens=False)
        self.hit = next((s for s in self.strings if s in text), None)
        return self.hit is not None


# --------------------------------------------------------------------------- prompts and model facts


def chat_text(tokenizer, user: str, system: str | None = None) -> str:
    """The model's own chat template applied to one user turn (and a system prompt), ending where
    the assistant's answer starts; an InputError when the tokenizer has no template."""
    if not getattr(tokenizer, "chat_template", None):
        raise InputError("this model's tokenizer has no chat template; give a plain prompt instead of --chat")
    if not user or not user.strip():
        raise InputError("--chat is empty; give the message to answer")
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def context_window(model_dir: Path) -> int | None:
    """The longest sequence the model has positions for (its family's position key: GPT-2 n_positions,
    Llama max_position_embeddings)."""
    return position_limit(Path(model_dir))


def eos_token_ids(model_dir: Path, tokenizer=None) -> list[int]:
    """EOS ids from generation_config.json, else config.json, else the tokenizer."""
    for name in ("generation_config.json", "config.json"):
        path = Path(model_dir) / name
        if path.is_file():
            value = json.loads(path.read_text()).get("eos_token_id")
            if value is not None:
                return [int(v) for v in (value if isinstance(value, list) else [value])]
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        return [int(tokenizer.eos_token_id)]
    return []


def encode_prompt(tokenizer, prompt: str, max_new_tokens: int, context: int | None, templated: bool = False) -> list[int]:
    """Token ids of ``prompt``; an empty prompt or one that cannot fit the context window with
    ``max_new_tokens`` more tokens is an InputError that says what to change. ``templated``: the
    text came from a chat template, which already holds the special tokens it wants."""
    if prompt is None or not prompt.strip():
        raise InputError('the prompt is empty; give the text to continue, e.g. xformopt generate ARTIFACT "Once upon a time"')
    ids = list(tokenizer(prompt, add_special_tokens=not templated)["input_ids"])
    if not ids:
        raise InputError(f"the prompt {prompt!r} tokenizes to no tokens; give some text the tokenizer knows")
    if context is not None:
        if len(ids) >= context:
            raise InputError(
                f"the prompt is {len(ids)} tokens, longer than the model's context window of {context} tokens "
                f"(leaving no room to generate); shorten it to at most {context - 1} tokens"
            )
        if len(ids) + max_new_tokens > context:
            raise InputError(
                f"the prompt ({len(ids)} tokens) plus --max-new-tokens {max_new_tokens} exceeds the model's context "
                f"window of {context} tokens; lower --max-new-tokens to {context - len(ids)} or shorten the prompt"
            )
    return ids
