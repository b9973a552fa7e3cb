"""`xformopt generate ARTIFACT "prompt"`: text generation from a decoder artifact, streamed to stdout."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from xformopt import models
from xformopt.cli import options as opt, output
from xformopt.decoder.generate import (
    Sampling,
    StopStrings,
    chat_text,
    context_window,
    encode_prompt,
    eos_token_ids,
    generate as run_generation,
)
from xformopt.errors import InputError
from xformopt.families import DECODERS
from xformopt.measure import host as host_facts
from xformopt.models import load_tokenizer
from xformopt.runtime.decoder import OrtDecoder
from xformopt.validate import check_threads

EXAMPLES = """
Examples:

    xformopt generate out/ "The movie was" --max-new-tokens 32                 # greedy
    xformopt generate out/ "The movie was" --temperature 0.8 --top-p 0.9 --seed 7
    xformopt generate out/ "The movie was" --top-k 40 --seed 1 --json | jq .text
    xformopt generate out/ "The movie was" --no-cache                          # recompute every step (slow)
    xformopt generate out/ --chat "What is the capital of France?"              # the model's chat template
    xformopt generate out/ --chat "Name three fruits." --system "Answer briefly." --stop "."

The continuation streams to stdout as it is generated; timings go to stderr (--json: one document).
"""


def open_decoder(artifact: Path):
    """The artifact's spec, checked: an ONNX decoder with its tokenizer and config."""
    path = Path(artifact)
    if not path.exists():
        raise InputError(f"artifact not found: {path}; pass the -o folder of `xformopt export/fuse/quantize/optimize`")
    if not path.is_dir():
        raise InputError(f"{path} is a file; pass the artifact directory that holds model.onnx")
    if not (path / "model.onnx").is_file():
        raise InputError(f"{path} has no model.onnx; export the decoder first: xformopt export MODEL -o NEW_DIR, then generate from NEW_DIR")
    spec = models.resolve(str(path))
    if not spec.is_decoder:
        raise InputError(f"{path} is a {spec.model_type} {spec.task} artifact; generate needs a decoder "
                         f"({', '.join(DECODERS)}) exported for text-generation")
    return spec


class Streamer:
    """Writes the decoded continuation as tokens arrive; holds back a partial UTF-8 character."""

    def __init__(self, tokenizer, stream):
        self.tokenizer, self.stream = tokenizer, stream
        self.ids: list[int] = []
        self.printed = ""

    def __call__(self, token: int) -> None:
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return
        self.stream.write(text[len(self.printed):])
        self.stream.flush()
        self.printed = text


def generate(
    artifact: Path = typer.Argument(..., metavar="DIR", help="Decoder artifact directory (model.onnx, tokenizer, config)."),
    prompt: str = typer.Argument(None, metavar="[PROMPT]", help="The text to continue (or --chat)."),
    chat: str = typer.Option(None, "--chat", help="A user message, put through the model's chat template; the answer streams."),
    system: str = typer.Option(None, "--system", help="With --chat: the system prompt (else the template's default)."),
    stop: list[str] = typer.Option(None, "--stop", help="Stop once the output contains this string (repeatable; kept in the output, as transformers keeps it)."),
    max_new_tokens: int = typer.Option(32, "--max-new-tokens", "-n", min=1, help="Tokens to generate at most."),
    greedy: bool = typer.Option(False, "--greedy", help="Argmax decoding (the default unless a sampling option is given)."),
    sample: bool = typer.Option(False, "--sample", help="Sample (temperature 1) even without --temperature/--top-k/--top-p."),
    temperature: float = typer.Option(None, "--temperature", help="Sampling temperature (> 0); implies sampling."),
    top_k: int = typer.Option(None, "--top-k", help="Sample among the k most likely tokens; implies sampling."),
    top_p: float = typer.Option(None, "--top-p", help="Nucleus sampling: the smallest set of tokens with probability >= p."),
    seed: int = typer.Option(0, "--seed", help="Sampling seed: the same seed gives the same text."),
    cache: bool = typer.Option(True, "--cache/--no-cache", help="Use the KV cache (--no-cache recomputes the whole sequence every step)."),
    io_binding: bool = typer.Option(True, "--io-binding/--no-io-binding", help="Keep the cache in ONNX Runtime between steps."),
    stop_at_eos: bool = typer.Option(True, "--stop-at-eos/--ignore-eos", help="Stop at the end-of-sequence token."),
    threads: opt.Threads = None,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document (text, token ids, timings) instead of streaming."),
    quiet: opt.Quiet = False,
) -> None:
    """Generate text from a decoder artifact (greedy or sampled), streaming tokens to stdout.

    The KV cache stays on the ONNX Runtime side between steps (IO binding); the prompt is the first
    step, with an empty past. A prompt that is empty or does not fit the model's context window
    with --max-new-tokens more tokens is refused (exit 2) with the numbers to change.
    """
    check_threads(threads)
    do_sample = sample or any(v is not None for v in (temperature, top_k, top_p))
    if greedy and do_sample:
        raise InputError("--greedy cannot be combined with --sample/--temperature/--top-k/--top-p; choose one")
    sampling = Sampling(do_sample=do_sample, temperature=1.0 if temperature is None else temperature,
                        top_k=top_k, top_p=top_p, seed=seed)
    if (prompt is None) == (chat is None):
        raise InputError('give a PROMPT to continue or --chat "message" to answer (one of the two)')
    if system is not None and chat is None:
        raise InputError("--system goes with --chat; put it into the PROMPT for plain continuation")
    spec = open_decoder(artifact)
    tokenizer = load_tokenizer(spec.path, spec.trust_remote_code)
    text_in = chat_text(tokenizer, chat, system) if chat is not None else prompt
    ids = encode_prompt(tokenizer, text_in, max_new_tokens, context_window(spec.path), templated=chat is not None)
    stopper = StopStrings(tokenizer, stop) if stop else None
    threads = threads or host_facts.usable_cpus()
    runner = OrtDecoder(spec.path, threads=threads, io_binding=io_binding)
    output.log(f"{spec.model_type} from {spec.path}: prompt {len(ids)} tokens, {sampling.describe()}, "
               f"{'KV cache' if cache else 'no cache'}, {threads} threads")
    streamer = None if as_json else Streamer(tokenizer, sys.stdout)
    result = run_generation(runner, ids, max_new_tokens, sampling,
                            eos_token_id=eos_token_ids(spec.path, tokenizer) if stop_at_eos else None,
                            use_cache=cache, on_token=streamer, stop=stopper)
    text = tokenizer.decode(result.new_ids, skip_special_tokens=True)
    if streamer is not None:  # whatever was held back (a character the model never completed)
        sys.stdout.write(text[len(streamer.printed):])
    per_token = (sum(result.step_s) / len(result.step_s) * 1000) if result.step_s else float("nan")
    summary = (f"{len(result.new_ids)} tokens in {result.total_s:.2f} s: first token {result.first_token_s * 1000:.1f} ms, "
               f"then {per_token:.2f} ms/token, {result.tokens_per_s:.1f} tokens/s (stopped: {result.stopped})")
    if as_json:
        output.emit_json({"prompt": text_in, **({"chat": chat, "system": system} if chat is not None else {}),
                          **({"stop_string": stopper.hit} if stopper is not None else {}), "prompt_ids": result.prompt_ids, "text": text, "new_ids": result.new_ids,
                          "decoding": sampling.describe(), "use_cache": cache, "io_binding": io_binding,
                          "stopped": result.stopped, "ttft_ms": result.first_token_s * 1000,
                          "per_token_ms": [s * 1000 for s in result.step_s], "tokens_per_s": result.tokens_per_s,
                          "threads": threads})
        return
    sys.stdout.write("\n")
    sys.stdout.flush()
    output.log(summary)


def register(app: typer.Typer) -> None:
    app.command("generate", help=(generate.__doc__ or "") + EXAMPLES)(generate)
