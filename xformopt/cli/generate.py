"""`xformopt generate ARTIFACT "prompt"`: text generation from a decoder artifact, streamed to stdout."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from xformopt import api
from xformopt.cli import options as opt
from xformopt.cli import output
from xformopt.decoder.generator import check_prompt, open_decoder, sampling_of
from xformopt.errors import InputError
from xformopt.models.validate import check_threads
from xformopt.seq2seq.text import Text2TextModel, is_seq2seq_artifact

EXAMPLES = """
Examples:

    xformopt generate out/ "The movie was" --max-new-tokens 32                 # greedy
    xformopt generate out/ "The movie was" --temperature 0.8 --top-p 0.9 --seed 7
    xformopt generate out/ "The movie was" --top-k 40 --seed 1 --json | jq .text
    xformopt generate out/ "The movie was" --no-cache                          # recompute every step (slow)
    xformopt generate out/ --chat "What is the capital of France?"              # the model's chat template
    xformopt generate out/ --chat "Name three fruits." --system "Answer briefly." --stop "."
    xformopt generate t5-out/ "translate English to German: Hello" --num-beams 4   # encoder-decoder artifacts

The continuation streams to stdout as it is generated; timings go to stderr (--json: one document).
"""


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
    prompt: str = typer.Argument(None, metavar="PROMPT", help="The text to continue (or --chat)."),
    chat: str = typer.Option(None, "--chat", help="A user message, put through the model's chat template; the answer streams."),
    system: str = typer.Option(None, "--system", help="With --chat: the system prompt (else the template's default)."),
    stop: list[str] = typer.Option(None, "--stop", help="Stop once the output contains this string (repeatable; kept "
        "in the output, as transformers keeps it)."),
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
    num_beams: int = typer.Option(None, "--num-beams", help="Encoder-decoder artifacts: beam width [default: the "
                                  "model's generation config]."),
    length_penalty: float = typer.Option(None, "--length-penalty", help="Encoder-decoder artifacts with beams: "
                                         "exponent of the length a finished beam's score is divided by."),
    quiet: opt.Quiet = False,
) -> None:
    """Generate text from a decoder artifact (greedy or sampled), streaming tokens to stdout.

    The KV cache stays on the ONNX Runtime side between steps (IO binding); the prompt is the first
    step, with an empty past. A prompt that is empty or does not fit the model's context window
    with --max-new-tokens more tokens is refused (exit 2) with the numbers to change.
    """

    check_threads(threads)
    if is_seq2seq_artifact(artifact):  # translation, summarization: the source is the prompt, no streaming
        _text2text(artifact, prompt, max_new_tokens, num_beams, length_penalty, threads, as_json)
        return
    if num_beams is not None or length_penalty is not None:
        raise InputError("--num-beams and --length-penalty apply to encoder-decoder artifacts (translation, "
                         "summarization); decoders decode greedily or sample")
    do_sample = sample or any(v is not None for v in (temperature, top_k, top_p))
    if greedy and do_sample:
        raise InputError("--greedy cannot be combined with --sample/--temperature/--top-k/--top-p; choose one")
    sampling = dict(do_sample=True if sample else None, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    sampling_of(**sampling)  # a bad temperature or top-p fails before the model is opened
    check_prompt(prompt, chat, system)
    open_decoder(artifact)  # not a decoder artifact: say so (api.load would open an encoder's predictor)
    generator = api.load(artifact, threads=threads, io_binding=io_binding)
    streamer = None if as_json else Streamer(generator.tokenizer, sys.stdout)
    out = generator.generate(prompt, max_new_tokens, chat=chat, system=system, stop=stop, **sampling, use_cache=cache,
                             stop_at_eos=stop_at_eos, on_token=streamer)
    result, text = out.generation, out.text
    if streamer is not None:  # whatever was held back (a character the model never completed)
        sys.stdout.write(text[len(streamer.printed):])
    per_token = (sum(result.step_s) / len(result.step_s) * 1000) if result.step_s else float("nan")
    summary = (f"{len(result.new_ids)} tokens in {result.total_s:.2f} s: first token {result.first_token_s * 1000:.1f} ms, "
               f"then {per_token:.2f} ms/token, {result.tokens_per_s:.1f} tokens/s (stopped: {result.stopped})")
    if as_json:
        record = out.to_dict()
        output.emit_json({**{k: record[k] for k in ("prompt", "chat", "system", "stop_string") if k in record},
                          "prompt_ids": result.prompt_ids, "text": text, "new_ids": result.new_ids,
                          "decoding": out.decoding, "use_cache": cache, "io_binding": io_binding,
                          "stopped": result.stopped, "ttft_ms": result.first_token_s * 1000,
                          "per_token_ms": [s * 1000 for s in result.step_s], "tokens_per_s": result.tokens_per_s,
                          "threads": generator.threads})
        return
    sys.stdout.write("\n")
    sys.stdout.flush()
    output.log(summary)


def _text2text(artifact: Path, source: str | None, max_new_tokens: int, num_beams: int | None,
               length_penalty: float | None, threads: int | None, as_json: bool) -> None:
    if not source or not source.strip():
        raise InputError("give the source text to translate or summarize: xformopt generate DIR \"TEXT\"")
    model = Text2TextModel(artifact, threads=threads)
    settings = model.options(num_beams=num_beams, max_new_tokens=max_new_tokens, length_penalty=length_penalty)
    [out], seconds = model.timed([source], settings)
    if as_json:
        output.emit_json({"source": source, "text": out.text, "new_ids": out.ids, "stopped": out.stopped,
                          "num_beams": settings.num_beams, "seconds": seconds,
                          "tokens_per_s": len(out.ids) / seconds if seconds else None, "threads": threads})
        return
    sys.stdout.write(out.text + "\n")
    sys.stdout.flush()
    output.log(f"{len(out.ids)} tokens in {seconds:.2f} s ({settings.num_beams} beam(s), stopped: {out.stopped})")


def register(app: typer.Typer) -> None:
    app.command("generate", help=(generate.__doc__ or "") + EXAMPLES)(generate)
