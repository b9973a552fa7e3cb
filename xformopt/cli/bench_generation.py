"""`xformopt bench` on a decoder artifact: the generation benchmark's flags and tables (for cli/bench.py).

Times PyTorch (the model the manifest names), earlier stages still in the pass cache or given with
--compare, and the artifact: time to first token, per-token latency percentiles and tokens/s at
every --prompt-tokens x --new-tokens, with and without the KV cache, in one interleaved run.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from xformopt.cli import output
from xformopt.errors import InputError
from xformopt.report.generation import rows

DECODER_EXAMPLES = """
Decoders (text-generation artifacts):

    xformopt bench gen/                                   # PyTorch, cached earlier stages, artifact; 16,64 x 32,128 tokens
    xformopt bench q/ --compare e/ --compare f/ --prompt-tokens 16 --new-tokens 128 --rounds 3
    xformopt bench gen/ --cache-only --json | jq '.cells[0].results'
"""


def ints(value: str, flag: str) -> tuple[int, ...]:
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
                          "KV gain = total time without the cache / with it; MB/token: bytes a cached step reads "
                          "(weights as the kernels read them, KV at the cell's mean length), GB/s at its p50")
    for i, name in enumerate(header):
        table.add_column(name, justify="left" if i in (2, 3) else "right", no_wrap=i in (2, 5))
    for row in body:
        table.add_row(*row)
    return table


def print_generation(doc: dict) -> None:
    console = output.stdout if output.stdout.is_terminal else Console(width=120, soft_wrap=True)
    console.print(generation_table(doc))
    for cell in doc["cells"]:
        gains = ", ".join(f"{name} {ratio:.1f}x" for name, ratio in cell["cache_speedup"].items())
        if gains:
            output.stdout.print(f"prompt {cell['prompt_tokens']}, {cell['new_tokens']} new tokens: KV cache vs none "
                                f"(median total time): {gains}", highlight=False, markup=False)
    for note in doc["notes"]:
        output.stdout.print(f"note: {note}", highlight=False, markup=False)
