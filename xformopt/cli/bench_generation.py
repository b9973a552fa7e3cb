"""`xformopt bench` on a decoder artifact: the generation benchmark (called from cli/bench.py).

Times PyTorch (the model the manifest names), earlier stages still in the pass cache or given with
--compare, and the artifact: time to first token, per-token latency percentiles and tokens/s at
every --prompt-tokens x --new-tokens, with and without the KV cache, in one interleaved run.
"""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from xformopt.atomic import write_text as write_text_atomic
from xformopt.cli import output
from xformopt.decoder.bench import bench_artifact, rows
from xformopt.errors import InputError

DECODER_EXAMPLES = """
Decoders (text-generation artifacts):

    xformopt bench gen/                                   # PyTorch, cached earlier stages, artifact; 16,64 x 32,128 tokens
    xformopt bench q/ --compare e/ --compare f/ --prompt-tokens 16 --new-tokens 128 --rounds 3
    xformopt bench gen/ --cache-only --json | jq '.cells[0].results'
"""


def ints(value: str | None, flag: str, default: tuple[int, ...]) -> tuple[int, ...]:
    if value is None:
        return default
    try:
        numbers = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise InputError(f"{flag} takes whole numbers separated by commas, e.g. 16,64 (got {value!r})") from None
    if not numbers or min(numbers) < 1:
        raise InputError(f"{flag} values must be at least 1 (got {value!r})")
    return numbers


def generation_table(doc: dict) -> Table:
    header, body = rows(doc)
    s = doc["settings"]
    table = Table(title=f"generation bench {doc['artifact_path']} (greedy, batch 1, times in ms)",
                  caption=f"{s['threads']} threads, {s['rounds']} interleaved rounds, prompts of real held-out text; "
                          "KV gain = total time without the cache / with it")
    for i, name in enumerate(header):
        table.add_column(name, justify="left" if i in (2, 3) else "right", no_wrap=i in (2, 5))
    for row in body:
        table.add_row(*row)
    return table


def run(artifact: Path, *, compare, pytorch: bool, prompt_tokens: str | None, new_tokens: str | None, cache_only: bool,
        rounds: int | None, threads: int | None, seed: int | None, as_json: bool, out: Path | None, gate_flags: dict) -> None:
    used = [flag for flag, value in gate_flags.items() if value]
    if used:
        raise InputError(f"{', '.join(used)}: the regression gate is not available for text-generation artifacts yet; "
                         "run `xformopt bench` without it (the generation benchmark)")
    doc = bench_artifact(
        artifact, compare=compare or (), pytorch=pytorch, prompt_lengths=ints(prompt_tokens, "--prompt-tokens", (16, 64)),
        new_tokens=ints(new_tokens, "--new-tokens", (32, 128)), cache_modes=("cache",) if cache_only else ("cache", "no_cache"),
        rounds=rounds or 3, threads=threads, seed=seed or 0, log=output.log,
    )
    if out is not None:
        write_text_atomic(out, json.dumps(doc, indent=2, default=str) + "\n")
        output.log(f"wrote {out}")
    if as_json:
        output.emit_json(doc)
        return
    console = output.stdout if output.stdout.is_terminal else Console(width=120, soft_wrap=True)
    console.print(generation_table(doc))
    for cell in doc["cells"]:
        gains = ", ".join(f"{name} {ratio:.1f}x" for name, ratio in cell["cache_speedup"].items())
        if gains:
            output.stdout.print(f"prompt {cell['prompt_tokens']}, {cell['new_tokens']} new tokens: KV cache vs none "
                                f"(median total time): {gains}", highlight=False, markup=False)
    for note in doc["notes"]:
        output.stdout.print(f"note: {note}", highlight=False, markup=False)
