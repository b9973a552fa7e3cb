"""An encoder-decoder artifact as a text-to-text model: what `xformopt generate` and `xformopt serve`
call (sources in, generated texts out, batched, with the generation config's rules and overrides)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from xformopt.errors import InputError
from xformopt.models import artifact_task, load_tokenizer, position_limit
from xformopt.seq2seq import GRAPH_FILES
from xformopt.seq2seq.generate import GenerationSettings, generate
from xformopt.seq2seq.runner import OrtSeq2Seq
from xformopt.seq2seq.search_graph import open_search_graph
from xformopt.seq2seq.source_encoding import SourceEncoder


@dataclass
class Generated:
    text: str
    ids: list[int]
    source_tokens: int
    stopped: str  # "eos" or "length"


def is_seq2seq_artifact(path: str | Path) -> bool:
    """True for a folder holding both graphs of an encoder-decoder task (read from files, nothing loaded)."""
    path = Path(path)
    task = artifact_task(path) if path.is_dir() else None
    return task is not None and task.graph == "seq2seq" and all((path / g).is_file() for g in GRAPH_FILES)


class Text2TextModel:
    def __init__(self, path: str | Path, threads: int | None = None, search_graph: bool = True):
        """``search_graph``: decode in the artifact's ``generate.onnx`` where it has one and the settings allow
        (:mod:`xformopt.seq2seq.search_graph`); False: always the Python loop (what the benchmarks compare it with)."""
        path = Path(path)
        if not path.is_dir():
            raise InputError(f"artifact not found: {path}; pass the -o folder of `xformopt optimize` or `xformopt export`")
        missing = [g for g in GRAPH_FILES if not (path / g).is_file()]
        if missing:
            raise InputError(f"{path} has no {', '.join(missing)}; export the encoder-decoder first: "
                             "xformopt export MODEL -o NEW_DIR")
        self.path, self.threads = path, threads
        self.task = artifact_task(path)
        self.tokenizer = load_tokenizer(path)
        search = open_search_graph(path, threads) if search_graph else None
        self.runner = OrtSeq2Seq(path, threads=threads, search=search)
        self.settings = GenerationSettings.from_model_dir(path)
        self.max_length = position_limit(path) or int(self.tokenizer.model_max_length or 512)
        self.encode = SourceEncoder(self.tokenizer, self.max_length)

    def options(self, num_beams: int | None = None, max_new_tokens: int | None = None,
                length_penalty: float | None = None) -> GenerationSettings:
        """The generation config with the caller's overrides (checked: a bad value is an InputError)."""
        settings = self.settings.with_(num_beams=num_beams, max_new_tokens=max_new_tokens, length_penalty=length_penalty)
        if settings.max_new_tokens > self.max_length:
            raise InputError(f"max_new_tokens {settings.max_new_tokens} is more than the model's {self.max_length} "
                             f"positions; ask for at most {self.max_length}")
        return settings

    def generate(self, sources: list[str], settings: GenerationSettings | None = None) -> list[Generated]:
        """One batch: every source padded to the longest (truncated at the model's positions)."""
        if not sources or any(not isinstance(s, str) or not s.strip() for s in sources):
            raise InputError("every source must be a non-empty text")
        settings = settings or self.settings
        input_ids, attention_mask = self.encode(sources)
        rows = generate(self.runner, input_ids, attention_mask, settings)
        eos = set(settings.eos_token_id)
        return [Generated(self.tokenizer.decode(r, skip_special_tokens=True).strip(), [int(t) for t in r],
                          int(m.sum()), "eos" if r and r[-1] in eos else "length")
                for r, m in zip(rows, attention_mask)]

    def timed(self, sources: list[str], settings: GenerationSettings | None = None) -> tuple[list[Generated], float]:
        started = time.perf_counter()
        out = self.generate(sources, settings)
        return out, time.perf_counter() - started
