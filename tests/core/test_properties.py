"""Property-based: generated recipes, data files, configs and baselines thrown at the CLI. The only
outcomes are a result (exit 0; exit 1 for a gate that compared valid documents) or exit 2 with one
`error:` line: never a traceback, never exit 3 for bad input.

Recipes and data files go through `optimize` up to the point where work would start (the first
pass is replaced by a marker, exit 99 = "accepted"); configs run the real `export`, so a config
that validation lets through must also export; baselines run a real `bench --baseline` gate with
the artifact's timing faked (no clock).
"""

from __future__ import annotations

import copy
import json
import math
import os
from pathlib import Path

import pytest
import yaml
from helpers import error_lines, run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xformopt.errors import XformoptError

ACCEPTED = 99
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True, database=None)


class Accepted(XformoptError):
    exit_code = ACCEPTED


def assert_clean_outcome(code: int, err: str, allowed=(0, ACCEPTED)) -> None:
    assert "Traceback" not in err, err
    if code in allowed:
        return
    assert code in (1, 2), (code, err)
    errors = [line for line in error_lines(err) if not line.startswith("xformopt:")]
    assert len(errors) == 1 and errors[0].startswith("error: "), (code, err)


@pytest.fixture
def stop_before_work(monkeypatch):
    def marker(*args, **kwargs):
        raise Accepted("accepted: work would start here")

    monkeypatch.setattr("xformopt.pipeline.execute_run", marker)


# --------------------------------------------------------------------------- generators

KEYS = ["name", "passes", "target", "task", "evaluation", "export", "fuse", "quantize", "prune", "opset", "mode",
        "select", "limit", "seed", "threads", "data", "latency_rounds", "repeats", "batch", "seq", "modes", "x"]
scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**30, 10**30), st.floats(allow_nan=True),
                    st.text(max_size=12), st.sampled_from(["export", "fuse", "quantize", "avx2", "dynamic", "all"]))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(KEYS), inner, max_size=4)), max_leaves=12)


@st.composite
def recipe_texts(draw) -> bytes:
    kind = draw(st.sampled_from(["structured", "near-valid", "bytes"]))
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "near-valid":
        doc = {"name": "p", "passes": ["export"], "evaluation": {"limit": 8, "latency_rounds": 3}}
        section = draw(st.sampled_from(["root", "evaluation", "pass"]))
        key, value = draw(st.sampled_from(KEYS)), draw(values)
        if section == "root":
            doc[key] = value
        elif section == "evaluation":
            doc["evaluation"][key] = value
        else:
            doc["passes"] = ["export", {draw(st.sampled_from(["fuse", "quantize", "export"])): {key: value}}]
    else:
        doc = draw(st.dictionaries(st.sampled_from(KEYS), values, max_size=5))
    text = yaml.safe_dump(doc, allow_unicode=True)
    return text.encode("utf-8")


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-10**50, 10**50), st.floats(), st.text(max_size=20)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=8)


@st.composite
def data_files(draw) -> tuple[str, bytes]:
    suffix = draw(st.sampled_from([".jsonl", ".csv", ".json"]))
    if suffix == ".csv":
        rows = draw(st.lists(st.lists(st.text(alphabet="ab,\"\n1 -", max_size=8), min_size=1, max_size=3), max_size=6))
        body = "text,label\n" + "\n".join(",".join(r) for r in rows)
        return suffix, body.encode()
    rows = draw(st.lists(st.one_of(
        st.fixed_dictionaries({"text": st.one_of(st.text(max_size=30), json_values), "label": json_values}),
        json_values), min_size=0, max_size=6))
    if suffix == ".json":
        return suffix, json.dumps(rows).encode()
    return suffix, "\n".join(json.dumps(r) for r in rows).encode()


# --------------------------------------------------------------------------- properties


@SETTINGS
@given(text=recipe_texts())
def test_generated_recipes(text, tiny_classifier, heldout_file, tmp_path_factory, capsys, stop_before_work):
    folder = tmp_path_factory.mktemp("recipe")
    recipe = folder / "r.yaml"
    recipe.write_bytes(text)
    code, _, err = run_cli(["optimize", tiny_classifier, "-r", recipe, "--data", heldout_file, "-o", folder / "o"], capsys)
    assert_clean_outcome(code, err)
    code, _, err = run_cli(["recipes", "show", recipe, "--resolved"], capsys)
    assert_clean_outcome(code, err)


@SETTINGS
@given(data=data_files())
def test_generated_data_files(data, tiny_classifier, tmp_path_factory, capsys, stop_before_work):
    suffix, body = data
    folder = tmp_path_factory.mktemp("data")
    path = folder / f"d{suffix}"
    path.write_bytes(body)
    code, _, err = run_cli(["optimize", tiny_classifier, "--data", path, "--limit", "8", "-o", folder / "o"], capsys)
    assert_clean_outcome(code, err)


CONFIG_KEYS = ["hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size", "max_position_embeddings",
               "model_type", "label2id", "id2label", "intermediate_size", "architectures", "type_vocab_size",
               "hidden_act", "layer_norm_eps", "pad_token_id"]


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True, database=None)
@given(changes=st.dictionaries(st.sampled_from(CONFIG_KEYS),
                               st.one_of(st.just("<delete>"), json_values, st.integers(-3, 300)), min_size=1, max_size=3))
def test_generated_configs_export_or_are_refused(changes, tiny_classifier, tmp_path_factory, capsys):
    model = tmp_path_factory.mktemp("cfg")
    for item in Path(tiny_classifier).iterdir():
        if item.name != "config.json":
            os.symlink(item, model / item.name)
    config = json.loads((Path(tiny_classifier) / "config.json").read_text())
    for key, value in changes.items():
        if value == "<delete>":
            config.pop(key, None)
        else:
            config[key] = value
    (model / "config.json").write_text(json.dumps(config))
    code, _, err = run_cli(["export", model, "-o", model.parent / f"{model.name}-out"], capsys)
    assert_clean_outcome(code, err, allowed=(0,))


@pytest.fixture(scope="module")
def artifact(tmp_path_factory, tiny_classifier, heldout_file) -> Path:
    from xformopt import pipeline, recipe

    r = recipe.validate({"name": "p", "passes": ["export"],
                         "evaluation": {"data": str(heldout_file), "limit": 12, "latency_rounds": 3, "warmup": 0,
                                        "repeats": 2}})
    out = tmp_path_factory.mktemp("prop-bench") / "artifact"
    pipeline.run(str(tiny_classifier), r, out, use_cache=False)
    return out


PATHS = [("artifact", "latency", "median_ms"), ("artifact", "latency", "spread_ms"),
         ("artifact", "latency", "repeat_medians_ms"), ("artifact", "metrics", "accuracy", "value"),
         ("artifact", "metrics", "accuracy"), ("artifact", "metrics"), ("settings", "heldout"),
         ("settings", "heldout", "rows"), ("settings", "threads"), ("settings", "seed"), ("settings",),
         ("host",), ("host_fingerprint",), ("schema",), ("headline_metric",), ("stages",), ("artifact",)]
baseline_values = st.one_of(st.just("<delete>"), st.floats(), st.integers(-10**20, 10**20), st.text(max_size=5),
                            st.none(), st.lists(st.floats(), max_size=3), st.dictionaries(st.text(max_size=3), st.floats(),
                                                                                         max_size=2))


@SETTINGS
@given(changes=st.lists(st.tuples(st.sampled_from(PATHS), baseline_values), min_size=1, max_size=3))
def test_generated_baselines(changes, artifact, tmp_path_factory, capsys, monkeypatch):
    from xformopt.measure import modes

    report = json.loads((artifact / "report.json").read_text())
    monkeypatch.setattr(modes, "solo_repeats", lambda *a, **k: copy.deepcopy(report["artifact"]["latency"]))
    doc = copy.deepcopy(report)
    for path, value in changes:
        node = doc
        for key in path[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            if value == "<delete>":
                node.pop(path[-1], None)
            else:
                node[path[-1]] = value
    baseline = tmp_path_factory.mktemp("base") / "b.json"
    baseline.write_text(json.dumps(doc))
    code, _, err = run_cli(["bench", artifact, "--baseline", baseline], capsys)
    assert_clean_outcome(code, err, allowed=(0,))
    if any(isinstance(v, float) and not math.isfinite(v) for _, v in changes) and code == 0:
        # a non-finite number may only pass where it replaced a section the gate then lacked entirely
        assert all(not (isinstance(v, float) and not math.isfinite(v)) or len(p) == 1 for p, v in changes), err
