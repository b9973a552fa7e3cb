"""Bad input is one line and exit 2, before any work, never a traceback or exit 3 (issue 12, points
1, 2 and 6): model folders, ONNX files, data files, recipes, baselines, threads and bounds."""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from harden_helpers import one_error, quick_recipe, tree
from helpers import run_cli, write_heldout

from xformopt.measure.host import usable_cpus


@pytest.fixture
def model_copy(tmp_path, tiny_classifier) -> Path:
    dst = tmp_path / "model"
    shutil.copytree(tiny_classifier, dst)
    return dst


@pytest.fixture
def no_work(monkeypatch):
    """Any of these inputs must be refused before the first pass starts."""
    monkeypatch.setattr("xformopt.pipeline.execute_run", lambda *a, **k: pytest.fail("work started on bad input"))


def edit_config(model: Path, change) -> None:
    path = model / "config.json"
    config = json.loads(path.read_text())
    change(config)
    path.write_text(json.dumps(config))


CONFIG_CASES = {
    "array": (lambda m: (m / "config.json").write_text("[1, 2, 3]"), "not an object"),
    "not-utf8": (lambda m: (m / "config.json").write_bytes(b'{"model_type": "bert", "x": "\xff\xfe"}'), "not UTF-8"),
    "no-hidden-size": (lambda m: edit_config(m, lambda c: c.pop("hidden_size")), "lacks hidden_size"),
    "hidden-size-string": (lambda m: edit_config(m, lambda c: c.update(hidden_size="64")), "hidden_size must be"),
    "layers-bool": (lambda m: edit_config(m, lambda c: c.update(num_hidden_layers=True)), "num_hidden_layers must be"),
    "heads-not-dividing": (lambda m: edit_config(m, lambda c: c.update(num_attention_heads=5)), "not a multiple"),
    "label2id-strings": (lambda m: edit_config(m, lambda c: c.update(label2id={"negative": "zero", "positive": "one"})),
                         "label2id maps 'negative'"),
    "label2id-list": (lambda m: edit_config(m, lambda c: c.update(label2id=["a", "b"])), "label2id must be an object"),
    "id2label-keys": (lambda m: edit_config(m, lambda c: c.update(id2label={"a": "negative"})), "id2label maps 'a'"),
    "nested-deep": (lambda m: (m / "config.json").write_text("[" * 100_000 + "]" * 100_000), "config"),
    "truncated-weights": (lambda m: (m / "model.safetensors").write_bytes((m / "model.safetensors").read_bytes()[:5000]),
                          "is truncated"),
    "garbage-weights": (lambda m: (m / "model.safetensors").write_bytes(b"\x00" * 64), "not a readable safetensors"),
    "no-weights": (lambda m: (m / "model.safetensors").unlink(), "has no weights"),
    "no-tokenizer": (lambda m: [(m / n).unlink() for n in ("tokenizer.json", "vocab.txt", "tokenizer_config.json",
                                                           "special_tokens_map.json") if (m / n).exists()],
                     "tokenizer cannot be loaded"),
    "broken-tokenizer": (lambda m: (m / "tokenizer.json").write_text("{oops"), "tokenizer cannot be loaded"),
    # found by review (each was exit 3, or a silent random model):
    "index-without-metadata": (lambda m: shard(m, lambda index: index.pop("metadata")), "not a valid shard index"),
    "index-shard-outside": (lambda m: shard(m, lambda index: index["weight_map"].update(
        {next(iter(index["weight_map"])): "../elsewhere/model.safetensors"})), "not a valid shard index"),
    "no-tensors-in-header": (lambda m: (m / "model.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}"),
                             "holds none of the weights"),
    "max-length-negative": (lambda m: edit_json(m / "tokenizer_config.json", model_max_length=-1), "model_max_length is -1"),
    "max-length-string": (lambda m: edit_json(m / "tokenizer_config.json", model_max_length="big"), "model_max_length is 'big'"),
    "bin-pickling-code": (lambda m: to_bin(m, code=True), "weights_only=True"),
    "bin-garbage": (lambda m: to_bin(m, garbage=True), "cannot be loaded as plain weights"),
    # issue 21: tensors transformers would initialise at random, and only warn
    "index-lists-some": (lambda m: shard(m, lambda index: [index["weight_map"].pop(n) for n in list(index["weight_map"])
                                                           if ".layer.0.attention.self.query." in n]),
                         "model.safetensors.index.json does not list 2 tensor(s) the text-classification model needs, "
                         "which transformers would fill with random values: bert.encoder.layer.0.attention.self.query.bias, "
                         "bert.encoder.layer.0.attention.self.query.weight; re-download"),
    "index-lists-few": (lambda m: shard(m, lambda index: [index["weight_map"].pop(n) for n in list(index["weight_map"])[4:]]),
                        "tensor(s) the text-classification model needs"),
    "index-names-the-wrong-shard": (lambda m: shard(m, lambda index: index["weight_map"].update(
        {n: "model-00001-of-00002.safetensors" for n in index["weight_map"]})), "which does not hold it"),
    "file-lacks-tensors": (lambda m: drop_tensors(m, ".layer.1."), "model.safetensors lacks 16 tensor(s)"),
    "file-lacks-a-trained-head-part": (lambda m: drop_tensors(m, "pooler."), "model.safetensors lacks 2 tensor(s) the text-classification model "
                                       "needs, which transformers would fill with random values: bert.pooler.dense.bias"),
    "bin-index-lists-some": (lambda m: to_bin_shards(m, drop=".embeddings.word_embeddings."),
                             "pytorch_model.bin.index.json does not list 1 tensor(s)"),
}


def drop_tensors(model: Path, fragment: str) -> None:
    from safetensors.torch import load_file, save_file

    state = load_file(model / "model.safetensors")
    save_file({n: t for n, t in state.items() if fragment not in n}, model / "model.safetensors", metadata={"format": "pt"})


def to_bin_shards(model: Path, drop: str) -> None:
    """model.safetensors as two pytorch_model-0000N-of-00002.bin shards and their index, whose weight_map
    leaves out the tensors named with DROP (they are still in the shard: transformers reads what is listed)."""
    import torch
    from safetensors.torch import load_file

    state = load_file(model / "model.safetensors")
    (model / "model.safetensors").unlink()
    names = list(state)
    weight_map = {}
    for i, part in enumerate((names[: len(names) // 2], names[len(names) // 2:]), start=1):
        torch.save({n: state[n] for n in part}, model / f"pytorch_model-0000{i}-of-00002.bin")
        weight_map.update(dict.fromkeys(part, f"pytorch_model-0000{i}-of-00002.bin"))
    weight_map = {n: f for n, f in weight_map.items() if drop not in n}
    (model / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def edit_json(path: Path, **changes) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def shard(model: Path, change) -> None:
    """Split model.safetensors into two shards with an index (as save_pretrained does), then CHANGE the index."""
    from safetensors.torch import load_file, save_file

    state = load_file(model / "model.safetensors")
    (model / "model.safetensors").unlink()
    names = list(state)
    weight_map = {}
    for i, part in enumerate((names[: len(names) // 2], names[len(names) // 2:]), start=1):
        file = f"model-0000{i}-of-00002.safetensors"
        save_file({n: state[n] for n in part}, model / file, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, file))
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    change(index)
    (model / "model.safetensors.index.json").write_text(json.dumps(index))


class _RunsCode:
    def __reduce__(self):
        return (print, ("pickled code ran",))


def to_bin(model: Path, code: bool = False, garbage: bool = False) -> None:
    """Replace model.safetensors by a pytorch_model.bin: a pickle that calls code, or not a checkpoint at all."""
    import torch

    (model / "model.safetensors").unlink()
    if garbage:
        (model / "pytorch_model.bin").write_bytes(b"PK\x03\x04" + b"\x00" * 60)
    else:
        torch.save({"weight": torch.zeros(2), "x": _RunsCode()} if code else {}, model / "pytorch_model.bin")


def test_sharded_and_bin_only_models_still_work(model_copy, tmp_path, capsys):
    import torch
    from safetensors.torch import load_file

    binary = tmp_path / "bin-model"
    shutil.copytree(model_copy, binary)
    torch.save(load_file(binary / "model.safetensors"), binary / "pytorch_model.bin")
    (binary / "model.safetensors").unlink()
    shard(model_copy, lambda index: None)
    texts = ["a fine film", "dull and far too long"]
    want = _torch_logits(binary, texts)
    for model in (model_copy, binary):
        out = tmp_path / f"e-{model.name}"
        code, _, err = run_cli(["export", model, "-o", out], capsys)
        assert code == 0, err
        np.testing.assert_allclose(_onnx_logits(out, texts), want, atol=1e-4)  # the same weights were read


def _torch_logits(model_dir: Path, texts: list[str]):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    enc = AutoTokenizer.from_pretrained(model_dir)(texts, padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        return AutoModelForSequenceClassification.from_pretrained(model_dir).eval()(**enc).logits.numpy()


def _onnx_logits(stage: Path, texts: list[str]):
    import onnxruntime as ort
    from transformers import AutoTokenizer

    enc = AutoTokenizer.from_pretrained(stage)(texts, padding=True, truncation=True, return_tensors="np")
    session = ort.InferenceSession(str(stage / "model.onnx"), providers=["CPUExecutionProvider"])
    return session.run(None, {i.name: enc[i.name].astype(np.int64) for i in session.get_inputs()})[0]


@pytest.mark.parametrize("case", list(CONFIG_CASES))
def test_bad_model_folder_is_one_line_before_work(case, model_copy, heldout_file, tmp_path, capsys, no_work):
    damage, fragment = CONFIG_CASES[case]
    damage(model_copy)
    before = tree(model_copy)
    out = tmp_path / "out"
    code, _, err = run_cli(["optimize", model_copy, "-r", quick_recipe(tmp_path, heldout_file), "-o", out], capsys)
    one_error(code, err, fragment)
    assert not out.exists() and tree(model_copy) == before


@pytest.mark.parametrize("case", ["truncated-weights", "no-tokenizer", "array"])
def test_bad_model_folder_in_a_pass_command(case, model_copy, tmp_path, capsys):
    CONFIG_CASES[case][0](model_copy)
    code, _, err = run_cli(["export", model_copy, "-o", tmp_path / "e"], capsys)
    one_error(code, err, CONFIG_CASES[case][1])


def test_texts_longer_than_the_position_limit_are_cut_there(model_copy, tmp_path, capsys, test_rows):
    """The tokenizer allows 512 tokens, the model embeds 128 positions: texts are cut at 128, not crash."""
    config = json.loads((model_copy / "tokenizer_config.json").read_text())
    config["model_max_length"] = 512
    (model_copy / "tokenizer_config.json").write_text(json.dumps(config))
    words = " ".join(row["text"] for row in test_rows[:40])
    long_rows = [{"text": words, "label": row["label"]} for row in test_rows[:5]]
    long_rows += [{"text": row["text"], "label": row["label"]} for row in test_rows[5:10]]  # parity needs varied lengths
    data = write_heldout(tmp_path / "long.jsonl", long_rows)
    out = tmp_path / "out"
    code, _, err = run_cli(["optimize", model_copy, "-r", quick_recipe(tmp_path, data), "-o", out], capsys)
    assert code == 0, err
    report = json.loads((out / "report.json").read_text())
    assert [s["metrics"]["accuracy"]["n"] for s in report["stages"]] == [8] * len(report["stages"])  # limit 8, none dropped
    scored = json.loads((out / "reference" / "rows.json").read_text())["row_ids"]
    assert any(i < 5 for i in scored) and np.load(out / "reference" / "baseline_outputs.npy").shape == (8, 2)
    # xformopt's tokenizer for the artifact cuts at the 128 positions (not the 512 its config allows),
    # and the artifact scores such a text as PyTorch does
    import onnxruntime as ort
    import torch
    from transformers import AutoModelForSequenceClassification

    from xformopt.models import load_tokenizer

    enc = load_tokenizer(out)([words], truncation=True, return_tensors="np")
    assert enc["input_ids"].shape == (1, 128)
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    got = session.run(None, {i.name: enc[i.name].astype(np.int64) for i in session.get_inputs()})[0]
    with torch.no_grad():
        want = AutoModelForSequenceClassification.from_pretrained(model_copy).eval()(
            **{k: torch.from_numpy(v) for k, v in enc.items()}).logits.numpy()
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_zero_byte_onnx_is_refused(exported_classifier, tmp_path, capsys):
    stage = tmp_path / "stage"
    shutil.copytree(exported_classifier[0], stage)
    (stage / "model.onnx").write_bytes(b"")
    code, _, err = run_cli(["fuse", stage, "-o", tmp_path / "f"], capsys)
    one_error(code, err, "model.onnx is empty (0 bytes)")


@pytest.mark.parametrize(("name", "line", "fragment"), [
    ("deep", '{"text": "a", "label": ' + "[" * 100_000 + "]" * 100_000 + "}", "too deeply nested"),
    ("digits", '{"text": "a", "label": ' + "9" * 400 + "}", "too large to be a class id"),
    ("digit-string", '{"text": "a", "label": "' + "9" * 400 + '"}', "too large to be a class id"),
    ("huge-float", '{"text": "a", "label": 1e400}', "too large to be a class id"),
    ("many-digits", '{"text": "a", "label": ' + "9" * 5000 + "}", "number too long"),
    ("lone-surrogate", '{"text": "\\ud800 half a pair", "label": 1}', "lone surrogate"),  # review: was exit 3
])
def test_hostile_jsonl_is_one_line(name, line, fragment, tiny_classifier, tmp_path, capsys, no_work):
    data = tmp_path / f"{name}.jsonl"
    data.write_text('{"text": "fine", "label": 1}\n' + line + "\n")
    code, _, err = run_cli(["optimize", tiny_classifier, "-r", quick_recipe(tmp_path, data), "-o", tmp_path / "o"], capsys)
    one_error(code, err, str(data), fragment)


def test_data_file_that_is_a_fifo_is_refused_not_read(tiny_classifier, tmp_path, capsys, no_work):
    """Found by review: a FIFO (or /dev/zero via --data) blocked the run forever."""
    fifo = tmp_path / "held.jsonl"
    os.mkfifo(fifo)
    code, _, err = run_cli(["optimize", tiny_classifier, "-r", quick_recipe(tmp_path, fifo), "-o", tmp_path / "o"], capsys)
    one_error(code, err, str(fifo), "not a regular file")


def test_recipe_not_utf8_names_the_file(tiny_classifier, tmp_path, capsys):
    recipe = tmp_path / "latin1.yaml"
    recipe.write_bytes("name: café\npasses: [export]\n".encode("latin-1"))
    code, _, err = run_cli(["optimize", tiny_classifier, "-r", recipe, "-o", tmp_path / "o"], capsys)
    one_error(code, err, str(recipe), "not UTF-8")


def test_billion_laughs_recipe_is_refused_at_once(tiny_classifier, tmp_path, capsys):
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    recipe = tmp_path / "laughs.yaml"
    recipe.write_text("\n".join(lines) + "\npasses: [export]\n")
    code, _, err = run_cli(["optimize", tiny_classifier, "-r", recipe, "-o", tmp_path / "o"], capsys)
    one_error(code, err, str(recipe), "anchors and aliases")


@pytest.mark.parametrize(("text", "fragment"), [
    ("passes: " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),
    ('passes: [export]\nevaluation:\n  data: "/tmp/a\\0b"\n', "NUL character"),
])
def test_recipe_too_deep_or_with_a_nul_is_one_line(text, fragment, tiny_classifier, tmp_path, capsys):
    """Found by review: both were exit 3 (RecursionError, ValueError: embedded null byte)."""
    recipe = tmp_path / "hostile.yaml"
    recipe.write_text(text)
    code, _, err = run_cli(["optimize", tiny_classifier, "-r", recipe, "-o", tmp_path / "o"], capsys)
    one_error(code, err, str(recipe), fragment)


def test_threads_above_the_usable_cpus_name_the_limit(tiny_classifier, heldout_file, tmp_path, capsys, no_work):
    code, _, err = run_cli(["optimize", tiny_classifier, "-r", quick_recipe(tmp_path, heldout_file), "--threads", "10000",
                            "-o", tmp_path / "o"], capsys)
    one_error(code, err, "--threads 10000", f"{usable_cpus()} CPU(s)")


@pytest.mark.parametrize("flags", [["--seed", "-1"], ["--limit", "100000000000"], ["--batch", "1,100000"],
                                   ["--seq", "1,99999999"]])
def test_out_of_bounds_values_are_one_line(flags, tiny_classifier, heldout_file, tmp_path, capsys, no_work):
    code, _, err = run_cli(["optimize", tiny_classifier, "-r", quick_recipe(tmp_path, heldout_file), *flags,
                            "-o", tmp_path / "o"], capsys)
    one_error(code, err)


# --------------------------------------------------------------------------- baselines


@pytest.fixture(scope="module")
def artifact(tmp_path_factory, tiny_classifier, heldout_file) -> Path:
    from xformopt import pipeline, recipe

    r = recipe.validate({"name": "t", "passes": ["export"],
                         "evaluation": {"data": str(heldout_file), "limit": 12, "latency_rounds": 3, "warmup": 0,
                                        "repeats": 2}})
    out = tmp_path_factory.mktemp("harden-bench") / "artifact"
    pipeline.run(str(tiny_classifier), r, out, use_cache=False)
    return out


BASELINE_CASES = {
    "nan-spread": (lambda d: d["artifact"]["latency"].update(spread_ms=float("nan")), "artifact.latency.spread_ms"),
    "inf-median": (lambda d: d["artifact"]["latency"].update(median_ms=float("inf")), "artifact.latency.median_ms"),
    "nan-metric": (lambda d: d["artifact"]["metrics"]["accuracy"].update(value=float("nan")), "accuracy.value"),
    "missing-spread": (lambda d: d["artifact"]["latency"].pop("spread_ms"), "spread_ms is missing"),
    "metric-without-value": (lambda d: d["artifact"]["metrics"]["accuracy"].pop("value"), "value is missing"),
    "heldout-x": (lambda d: d["settings"].update(heldout="x"), "settings.heldout"),
    "threads-string": (lambda d: d["settings"].update(threads="2"), "settings.threads"),
    "nan-in-a-stage": (lambda d: d["stages"][0]["latency"].update(p90_ms=float("nan")), "stages[0].latency.p90_ms"),
    "negative-median": (lambda d: d["artifact"]["latency"].update(median_ms=-1.0), "median_ms"),
    # found by review: these passed the gate (exit 0)
    "negative-rounds": (lambda d: d["settings"].update(rounds=-3), "settings.rounds is -3"),
    "zero-repeats": (lambda d: d["settings"].update(repeats=0), "settings.repeats is 0"),
    "huge-threads": (lambda d: d["settings"].update(threads=10**30), "settings.threads"),
    # issue 21: numbers of the right type that no measurement gives
    "reversed-ci95": (lambda d: d["artifact"]["metrics"]["accuracy"].update(ci95=[0.9, 0.1]),
                      "accuracy.ci95 is [0.9, 0.1]: its low end is above its high end"),
    "accuracy-above-1": (lambda d: d["artifact"]["metrics"]["accuracy"].update(value=86.5), "accuracy.value is 86.5"),
    # min_ms set too, so that the measured minimum (any host speed) stays below the made-up median
    "p90-below-median": (lambda d: d["artifact"]["latency"].update(min_ms=0.5, median_ms=5.0, p90_ms=1.0),
                         "median_ms 5.0 above p90_ms"),
}


def test_baseline_nested_too_deeply_is_one_line(artifact, tmp_path, capsys):
    """Found by review: a baseline nested 100,000 deep was a RecursionError, exit 3."""
    baseline = tmp_path / "deep.json"
    baseline.write_text("[" * 100_000 + "]" * 100_000)
    code, _, err = run_cli(["bench", artifact, "--baseline", baseline], capsys)
    one_error(code, err, str(baseline), "nested too deeply")


@pytest.mark.parametrize("case", list(BASELINE_CASES))
def test_baseline_with_bad_numbers_is_refused_before_timing(case, artifact, tmp_path, capsys, monkeypatch):
    from xformopt.measure import modes

    monkeypatch.setattr(modes, "solo_repeats", lambda *a, **k: pytest.fail("timed against a bad baseline"))
    doc = json.loads((artifact / "report.json").read_text())
    change, fragment = BASELINE_CASES[case]
    change(doc)
    baseline = tmp_path / "baseline.json"
    baseline.write_text(json.dumps(doc))  # json writes NaN / Infinity, as a careless tool would
    code, _, err = run_cli(["bench", artifact, "--baseline", baseline], capsys)
    one_error(code, err, str(baseline), fragment)


BENCH_OUTPUT_CASES = {  # (flag args given the artifact, the data file, a model copy, tmp) -> fragment
    "-o artifact model.onnx": (lambda a, d, m, t: ["-o", a / "model.onnx"], "would overwrite a file this run reads"),
    "--junit artifact report.json": (lambda a, d, m, t: ["--junit", a / "report.json"], "would overwrite"),
    "-o the report's data file": (lambda a, d, m, t: ["-o", d], "choose another path"),
    "-o --data file": (lambda a, d, m, t: ["--data", d, "-o", d], "would overwrite"),
    "-o the baseline": (lambda a, d, m, t: ["--baseline", t / "b.json", "-o", t / "b.json"], "would overwrite"),
    "-o and --junit one file": (lambda a, d, m, t: ["-o", t / "x", "--junit", t / "x"], "are the same file"),
    "-o a model's config.json": (lambda a, d, m, t: ["-o", m / "config.json"], "is not an earlier bench document"),
    "--junit a source file": (lambda a, d, m, t: ["--junit", m / "vocab.txt"], "is not an earlier bench JUnit XML"),
}


@pytest.mark.parametrize("case", list(BENCH_OUTPUT_CASES))
def test_bench_outputs_never_overwrite_what_the_run_reads(case, artifact, heldout_file, model_copy, tmp_path, capsys,
                                                          monkeypatch):
    """Found by review: `bench -o ART/model.onnx` exit 0 replaced the artifact's model with JSON."""
    from xformopt.measure import modes

    monkeypatch.setattr(modes, "solo_repeats", lambda *a, **k: pytest.fail("timed before refusing the output path"))
    shutil.copy(artifact / "report.json", tmp_path / "b.json")
    def snapshot():
        return [tree(artifact), tree(model_copy), (tmp_path / "b.json").read_bytes(), heldout_file.read_bytes()]

    before = snapshot()
    flags, fragment = BENCH_OUTPUT_CASES[case]
    code, _, err = run_cli(["bench", artifact, *flags(artifact, heldout_file, model_copy, tmp_path)], capsys)
    one_error(code, err, fragment)
    assert snapshot() == before


def test_bench_output_replaces_an_earlier_bench_document(artifact, tmp_path, capsys):
    out, junit = tmp_path / "bench.json", tmp_path / "bench.xml"
    for _ in range(2):  # the second run replaces the first one's files
        code, _, err = run_cli(["bench", artifact, "--limit", "4", "-o", out, "--junit", junit], capsys)
        assert code == 0, err
    assert json.loads(out.read_text())["schema"] == "xformopt.bench/1"


def test_a_nan_spread_baseline_cannot_pass_a_5000x_slower_run(artifact, tmp_path, capsys, monkeypatch):
    """The original report: spread NaN made the noise NaN, and every comparison with NaN passed."""
    from xformopt.measure import modes

    doc = json.loads((artifact / "report.json").read_text())
    slow = copy.deepcopy(doc["artifact"]["latency"])
    slow.update(median_ms=doc["artifact"]["latency"]["median_ms"] * 5000, repeat_medians_ms=[1.0, 1.0], spread_ms=0.0)
    monkeypatch.setattr(modes, "solo_repeats", lambda *a, **k: copy.deepcopy(slow))
    doc["artifact"]["latency"]["spread_ms"] = float("nan")
    baseline = tmp_path / "nan.json"
    baseline.write_text(json.dumps(doc))
    code, _, err = run_cli(["bench", artifact, "--baseline", baseline], capsys)
    assert code == 2, err  # refused as bad input, never exit 0
