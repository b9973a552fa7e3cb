"""The single-pass commands' flags come from their passes' options models (xformopt/cli/pass_options.py):
every field is a flag with the model's default and description, or a stated omission; the flags users'
scripts already use keep their meaning; bad values are one line and exit 2."""

from __future__ import annotations

import json
from typing import Literal

import pytest
import typer
from helpers import error_lines, run_cli
from pydantic import BaseModel, Field
from typer.testing import CliRunner

from xformopt.accuracy_budget import parse as parse_budget
from xformopt.cli.app import app
from xformopt.cli.pass_options import Unexpressible, build_command, model_flags, options_from
from xformopt.cli.passes import COMMANDS
from xformopt.passes import get_pass

SPECS = {spec.name: spec for spec in COMMANDS}


@pytest.fixture(scope="module")
def root():
    return typer.main.get_command(app)


def parse(root, name: str, *args: str) -> dict:
    """The pass options `xformopt NAME SRC -o OUT ARGS` hands the pass (what the command body sends)."""
    ctx = root.commands[name].make_context(name, ["src", "-o", "out", *args])
    return options_from(SPECS[name].flags(), dict(ctx.params))


def test_the_commands_are_the_passes_with_options():
    assert set(SPECS) == {"export", "fuse", "quantize", "int4", "prune", "distill"}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_field_is_a_flag_with_the_models_default_and_help_or_left_out(root, name):
    spec, model = SPECS[name], get_pass(name).Options
    params = {p.name: p for p in root.commands[name].params}
    ctx = root.commands[name].make_context(name, ["src", "-o", "out"])
    flags = {flag.name: flag for flag in spec.flags()}
    for field, info in model.model_fields.items():
        if field in spec.left_out or field == spec.data_field:  # a recipe sets it, or the shared --data
            assert field == spec.data_field or spec.left_out[field].strip(), (name, field)
            assert field not in flags, (name, field)
            continue
        assert field in params and field in flags, f"{name}: option {field!r} has no flag and is not left out"
        assert info.description and params[field].help == info.description, (name, field)
        default = info.get_default(call_default_factory=True)
        assert flags[field].to_option(ctx.params[field]) == default, (name, field, ctx.params[field])
    assert parse(root, name) == {}  # nothing given: the model's defaults throughout


def test_recipe_only_options_are_named_in_the_help(capsys):
    code, out, _ = run_cli(["fuse", "--help"], capsys)
    assert code == 0 and "Set only in a recipe: expect" in " ".join(out.split())
    assert "--timing-rounds" in out and "--candidates" in out


def test_established_flags_keep_their_meaning(root):
    assert parse(root, "prune", "--sparsity", "0.5", "--no-latency", "--strategy", "depth", "--samples", "64") == {
        "sparsity": 0.5, "measure_latency": False, "strategy": "depth", "samples": 64}
    assert parse(root, "export", "--exporter", "family") == {}
    assert parse(root, "export", "--exporter", "dynamo", "--opset", "17") == {"exporter": "dynamo", "opset": 17}
    assert parse(root, "int4", "--keep-8bit", "lm_head, qkv", "--max-perplexity-increase", "3%",
                 "--algorithm", "hqq") == {"keep_8bit": ["lm_head", "qkv"], "max_perplexity_increase": "3%",
                                           "algorithm": "hqq"}
    assert parse(root, "int4", "--block-sizes", "down_proj=128, lm_head=64", "--requantize", "lm_head",
                 "--kv-cache", "int8", "--no-exact-gguf", "--fuse-projections", "--block-sums", "matmul") == {
        "block_sizes": "down_proj=128, lm_head=64", "requantize": ["lm_head"], "kv_cache": "int8", "exact_gguf": False,
        "fuse_projections": True, "block_sums": "matmul"}
    assert parse(root, "quantize", "--mode", "static", "--max-accuracy-drop", "1%", "--min-agreement", "0.95",
                 "--calibration-data", "rows.jsonl") == {
        "mode": "static", "max_accuracy_drop": parse_budget("1%"), "min_agreement": 0.95,
        "calibration_data": "rows.jsonl"}
    assert parse(root, "distill", "--teacher", "t", "--freeze-embeddings", "--no-resume", "--label-column", "",
                 "--max-minutes", "2") == {"teacher": "t", "freeze_embeddings": True, "resume": False,
                                           "label_column": "", "max_minutes": 2.0}
    assert parse(root, "fuse", "--select", "none") == {"select": "none"}


def test_new_flags_reach_the_model(root):
    options = parse(root, "distill", "--keep-layers", "0,2", "--weight-decay", "0", "--qat-per-channel")
    assert options == {"keep_layers": [0, 2], "weight_decay": 0.0, "qat_per_channel": True}
    assert get_pass("distill").Options.model_validate(options).keep_layers == [0, 2]
    options = parse(root, "quantize", "--exclude-nodes", "a,b", "--no-outlier-rules", "--weight-type", "uint8")
    assert get_pass("quantize").Options.model_validate(options).exclude_nodes == ["a", "b"]
    assert parse(root, "fuse", "--candidates", "all,none", "--no-expect-full") == {
        "candidates": ["all", "none"], "expect_full": False}


def test_a_field_without_a_command_line_form_must_be_left_out():
    class Toy(BaseModel):
        mapping: dict[str, int] = Field(default_factory=dict, description="op -> count")
        level: Literal["a", "b"] | None = Field(None, description="a or b")
        tri: bool | None = Field(None, description="default: the target's")
        size: int = Field(description="required: no default")

    with pytest.raises(Unexpressible, match="mapping"):
        model_flags(Toy)
    flags = model_flags(Toy, left_out={"mapping": "a mapping: recipes"})
    assert [f.name for f in flags] == ["level", "tri", "size"]
    seen = []
    toy = typer.Typer()
    toy.command()(build_command("toy", "A toy.", [f.parameter for f in flags],
                                lambda **values: seen.append(options_from(flags, values))))
    toy.command("other")(lambda: None)  # two commands: `toy` is a subcommand, as the passes are
    for args, want in ((["toy"], {}), (["toy", "--no-tri", "--level", "b"], {"tri": False, "level": "b"}),
                       (["toy", "--tri"], {"tri": True})):
        result = CliRunner().invoke(toy, [*args, "--size", "3"])
        assert result.exit_code == 0 and seen.pop() == {**want, "size": 3}, (args, result.output)
    result = CliRunner().invoke(toy, ["toy"])
    assert result.exit_code == 2 and "--size" in result.output and not seen
    with pytest.raises(ValueError, match="no field"):
        model_flags(Toy, left_out={"mapping": "x", "missing": "y"})


def test_fuse_runs_with_derived_flags(exported_classifier, heldout_file, tmp_path, capsys):
    out = tmp_path / "f"
    code, stdout, err = run_cli(["fuse", exported_classifier[0], "-o", out, "--select", "none", "--timing-rounds", "5",
                                 "--data", heldout_file, "--json"], capsys)
    assert code == 0, err
    entry = json.loads(stdout)
    assert entry["options"]["select"] == "none" and entry["options"]["timing_rounds"] == 5
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["passes"][-1]["options"] == entry["options"]


@pytest.mark.parametrize("args, fragment", [
    (["fuse", "STAGE", "--timing-rounds", "2"], "timing_rounds"),  # the model's ge=3
    (["fuse", "STAGE", "--select", "most"], "--select"),  # not a choice
    (["distill", "STAGE", "--keep-layers", "0,x"], "--keep-layers"),  # not a comma list of ints
    (["prune", "STAGE", "--sparsity", "0.5", "--layers", "2"], "exclusive"),  # the model's own rule
    (["int4", "STAGE", "--block-size", "48"], "block_size"),
    (["int4", "STAGE", "--block-sizes", "down_proj=48"], "block_sizes.down_proj"),  # each pair checked as block_size
    (["int4", "STAGE", "--block-sizes", "down_proj:64"], "role=N"),
    (["int4", "STAGE", "--block-sizes", "lm_head=64", "--algorithm", "gptq"], "rtn and hqq"),
    (["int4", "STAGE", "--kv-cache", "int4"], "--kv-cache"),
])
def test_bad_values_are_one_line_and_exit_2(exported_classifier, tmp_path, capsys, args, fragment):
    out = tmp_path / "o"
    args = [exported_classifier[0] if a == "STAGE" else a for a in args]
    code, _, err = run_cli([*args, "-o", out], capsys)
    lines = error_lines(err)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert fragment in lines[0], lines[0]
    assert not out.exists()
