"""Recipes: shipped ones validate; every mistake names the file, the line and the field."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml

from xformopt import recipe
from xformopt.errors import InputError
from xformopt.passes import get_pass


def write(tmp_path: Path, text: str, name: str = "my-recipe.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def load_error(path: Path) -> str:
    with pytest.raises(InputError) as info:
        recipe.load(str(path))
    message = info.value.message
    assert info.value.exit_code == 2
    assert "\n" not in message
    return message


# --------------------------------------------------------------------------- shipped recipes


@pytest.mark.parametrize("name", ["default", "fp32-fused"])
def test_shipped_recipes_load_and_validate(name):
    r = recipe.load(name)
    assert r.name == name
    assert [s.name for s in r.passes][:2] == ["export", "fuse"]
    # options are resolved: every option of every pass is present with its default filled in
    for step in r.passes:
        assert set(step.options) == set(get_pass(step.name).Options.model_fields)
    assert r.evaluation.limit is None  # every held-out row, as without --recipe
    assert r.evaluation.latency_rounds == 100


def test_shipped_names_lists_both():
    names = recipe.shipped_names()
    assert names[:2] == ["default", "fp32-fused"] and "prune-int8" in names and names == sorted(names)


def test_default_recipe_chain():
    r = recipe.load("default")
    assert [s.name for s in r.passes] == ["export", "fuse", "quantize"]
    assert r.passes[0].options["opset"] == 18
    assert r.passes[0].options["max_abs_diff"] == pytest.approx(1e-3)
    assert r.passes[1].options["select"] == "fastest"
    assert r.passes[2].options["mode"] == "dynamic"
    assert r.target == "auto"


def test_unknown_recipe_name_lists_shipped():
    with pytest.raises(InputError) as info:
        recipe.load("no-such-recipe")
    assert "recipe not found: no-such-recipe" in info.value.message
    assert "default" in info.value.message and "fp32-fused" in info.value.message


# --------------------------------------------------------------------------- line numbers


def test_unknown_top_level_key_names_file_line_and_field(tmp_path):
    path = write(tmp_path, """
        name: mine
        passes:
          - export
        colour: blue
    """)
    message = load_error(path)
    assert message.startswith(f"{path}:4: ")
    assert "colour" in message
    assert "extra" in message.lower() or "not permitted" in message.lower()


def test_unknown_pass_option_names_line_and_field(tmp_path):
    path = write(tmp_path, """
        name: mine
        passes:
          - export:
              opset: 17
          - fuse:
              select: all
              colour: blue
    """)
    message = load_error(path)
    assert message.startswith(f"{path}:7: ")
    assert "passes.1.fuse.colour" in message


def test_wrong_type_names_line_and_field(tmp_path):
    path = write(tmp_path, """
        # a comment line shifts everything down by one
        name: mine
        passes:
          - export:
              opset: "seventeen"
          - fuse
    """)
    message = load_error(path)
    assert message.startswith(f"{path}:5: ")
    assert "passes.0.export.opset" in message
    assert "integer" in message


def test_out_of_range_value_names_line_and_field(tmp_path):
    path = write(tmp_path, """
        passes:
          - export
          - fuse
          - quantize:
              min_agreement: 2
    """)
    message = load_error(path)
    assert message.startswith(f"{path}:5: ")
    assert "min_agreement" in message


def test_wrong_type_in_evaluation_names_line_and_field(tmp_path):
    path = write(tmp_path, """
        passes:
          - export
        evaluation:
          limit: 64
          latency_rounds: many
    """)
    message = load_error(path)
    assert message.startswith(f"{path}:5: ")
    assert "evaluation.latency_rounds" in message


@pytest.mark.parametrize("form", ["- sparsify", "- sparsify: {amount: 0.5}"])
def test_unknown_pass_name_names_line_and_known_passes(tmp_path, form):
    path = write(tmp_path, f"""
        name: mine
        passes:
          - export
          {form}
    """)
    message = load_error(path)
    assert message.startswith(f"{path}:4: ")
    assert "unknown pass 'sparsify'" in message
    assert "prune, distill, export, fuse, quantize" in message


def test_broken_yaml_reports_a_line(tmp_path):
    path = write(tmp_path, """
        name: mine
        passes: [export, fuse
        evaluation:
          limit: 3
    """)
    message = load_error(path)
    # the parser notices the unclosed '[' on line 3, where 'evaluation:' cannot be a list item
    assert message.startswith(f"{path}:3: broken YAML")
    assert "fix the recipe file" in message


def test_broken_yaml_unbalanced_brace(tmp_path):
    path = write(tmp_path, """
        passes:
          - export
          - fuse: {select: all
          - quantize
    """)
    message = load_error(path)
    assert f"{path}:" in message and "broken YAML" in message
    line = int(message[len(str(path)) + 1 :].split(":")[0])
    assert 3 <= line <= 5


def test_recipe_not_a_mapping(tmp_path):
    path = write(tmp_path, "- export\n- fuse\n")
    message = load_error(path)
    assert str(path) in message and "mapping" in message


def test_empty_pass_list_rejected(tmp_path):
    path = write(tmp_path, "name: mine\npasses: []\n")
    message = load_error(path)
    assert message.startswith(f"{path}:2: ")
    assert "passes" in message


# --------------------------------------------------------------------------- ordering contract


def test_fuse_before_export_rejected(tmp_path):
    path = write(tmp_path, """
        passes:
          - fuse
          - export
    """)
    message = load_error(path)
    assert message.startswith(f"{path}:2: ")
    assert "pass 'fuse' cannot run first" in message
    assert "ONNX model" in message


def test_quantize_first_rejected_via_validate():
    with pytest.raises(InputError) as info:
        recipe.validate({"passes": ["quantize"]})
    assert "pass 'quantize' cannot run first" in info.value.message


def test_export_twice_rejected():
    with pytest.raises(InputError) as info:
        recipe.validate({"passes": ["export", "export"]})
    assert "pass 'export' cannot run after 'export'" in info.value.message
    assert "PyTorch model" in info.value.message


@pytest.mark.parametrize("passes", [["export", "fuse", "fuse", "quantize"], [{"prune": {"sparsity": 0.3}}, {"prune": {"sparsity": 0.3}}, "export"]])
def test_a_pass_twice_is_rejected(passes):
    """The report has one stage per pass name: a repeated pass would scramble its rows."""
    with pytest.raises(InputError) as info:
        recipe.validate({"passes": passes})
    assert "appears twice" in info.value.message


def test_fuse_after_quantize_rejected(tmp_path):
    path = write(tmp_path, """
        passes:
          - export
          - quantize
          - fuse
    """)
    message = load_error(path)
    assert message.startswith(f"{path}:4: ")
    assert "pass 'fuse' cannot run after 'quantize'" in message
    assert "fusions match float subgraphs" in message


def test_quantize_twice_rejected(tmp_path):
    path = write(tmp_path, """
        passes:
          - export
          - quantize
          - quantize
    """)
    message = load_error(path)
    assert message.startswith(f"{path}:4: ")
    assert "pass 'quantize' cannot run after 'quantize'" in message
    assert "already quantized" in message


def test_export_only_and_export_quantize_are_valid():
    assert [s.name for s in recipe.validate({"passes": ["export"]}).passes] == ["export"]
    assert [s.name for s in recipe.validate({"passes": ["export", "quantize"]}).passes] == ["export", "quantize"]


# --------------------------------------------------------------------------- flags and round trip


def test_bad_opset_is_input_error():
    with pytest.raises(InputError) as info:
        recipe.validate({"passes": [{"export": {"opset": 9}}, "fuse"]})
    assert "opset" in info.value.message


@pytest.mark.parametrize("name", ["default", "fp32-fused"])
def test_to_yaml_round_trips_through_validate(name):
    original = recipe.load(name)
    text = original.to_yaml()
    again = recipe.validate(yaml.safe_load(text), "<round trip>", text)
    assert again.to_dict() == original.to_dict()
    assert again.to_yaml() == text


def test_to_yaml_round_trip_keeps_custom_options(tmp_path):
    path = write(tmp_path, """
        name: custom-one
        target: avx512_vnni
        passes:
          - export: {opset: 18}
          - fuse: {select: all, expect: {Attention: 2}}
          - quantize: {exclude_nodes: [a, b], per_channel: false}
        evaluation: {limit: 32, latency_rounds: 5, warmup: 1}
    """)
    original = recipe.load(str(path))
    again = recipe.validate(yaml.safe_load(original.to_yaml()))
    assert again.passes[1].options["expect"] == {"Attention": 2}
    assert again.passes[2].options["exclude_nodes"] == ["a", "b"]
    assert again.passes[2].options["per_channel"] is False
    assert again.evaluation.limit == 32 and again.evaluation.latency_rounds == 5
    assert again.to_dict() == original.to_dict()


# --------------------------------------------------------------------------- duplicate keys (issue 21)


@pytest.mark.parametrize("text, key, lines", [
    ("name: a\ntarget: avx2\npasses: [export]\ntarget: avx512\n", "target", (2, 4)),
    ("passes:\n  - export\n  - quantize:\n      mode: dynamic\n      per_channel: true\n      mode: static\n", "mode", (4, 6)),
    ("passes: [export]\nevaluation: {limit: 3, seed: 1, limit: 5}\n", "limit", (2, 2)),
], ids=["top-level", "pass-option", "flow-mapping"])
def test_a_key_given_twice_is_refused_naming_both_lines(tmp_path, text, key, lines):
    path = tmp_path / "dup.yaml"
    path.write_text(text)
    message = load_error(path)
    assert message.startswith(f"{path}:{lines[1]}: key {key!r} is given twice (lines {lines[0]} and {lines[1]})")
    assert "keep one" in message


def test_duplicate_keys_in_a_search_space_are_refused(tmp_path):
    from xformopt.recipe_search import space as spaces

    path = tmp_path / "space.yaml"
    path.write_text("choices:\n  quantize.mode: [dynamic]\n  fuse.select: [all]\n  quantize.mode: [static]\n")
    with pytest.raises(InputError) as info:
        spaces.load(str(path))
    assert info.value.message.startswith(f"{path}:4: key 'quantize.mode' is given twice (lines 2 and 4)")


def test_the_unique_key_loader_keeps_safe_load_semantics():
    """Same values as yaml.safe_load on every shipped recipe and preset, and still no Python objects."""
    from xformopt import safe_yaml
    from xformopt.recipe_search.space import PRESETS_DIR

    for path in [*recipe.RECIPES_DIR.glob("*.yaml"), *PRESETS_DIR.glob("*.yaml")]:
        text = path.read_text()
        assert safe_yaml.load(text) == yaml.safe_load(text), path
    assert safe_yaml.load("a: 1\n'1': x\n1: y\nb: {a: 2}\n") == {"a": 1, "1": "x", 1: "y", "b": {"a": 2}}
    with pytest.raises(yaml.YAMLError):
        safe_yaml.load("!!python/object/apply:os.system ['true']\n")
