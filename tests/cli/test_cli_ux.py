"""CLI shape and feedback: usage errors as one line, -q anywhere, help without <bool>, progress on
stderr (bars on a terminal, periodic lines elsewhere), and bench/report on single-pass outputs."""

from __future__ import annotations

import ast
import io
import json
import re
from pathlib import Path

import pytest
from helpers import ANY_LATENCY_DRIFT, error_lines, run_cli

from xformopt import progress
from xformopt.cli import output

ROOT = Path(__file__).resolve().parents[2]

LEAF_COMMANDS = [["optimize"], ["bench"], ["report"], ["export"], ["fuse"], ["quantize"], ["int4"], ["prune"], ["distill"],
                 ["generate"], ["search"], ["profile"], ["serve"], ["loadtest"], ["recipes", "list"], ["recipes", "show"], ["targets", "list"],
                 ["targets", "detect"], ["passes", "list"], ["cache", "list"], ["cache", "verify"], ["cache", "prune"],
                 ["cache", "clear"]]


def test_leaf_commands_is_every_command():
    import typer

    from xformopt.cli.app import app

    def leaves(command, path):
        if hasattr(command, "commands"):
            for name, sub in command.commands.items():
                yield from leaves(sub, [*path, name])
        else:
            yield path

    assert sorted(leaves(typer.main.get_command(app), [])) == sorted(LEAF_COMMANDS)


def one_error_line(code: int, err: str) -> str:
    lines = error_lines(err)
    assert code == 2, err
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]


# --------------------------------------------------------------------------- usage errors


@pytest.mark.parametrize("args, fragment, command", [
    (["bench", "out/", "--frobnicate"], "No such option: --frobnicate", "xformopt bench"),
    (["bench"], "Missing argument 'DIR'", "xformopt bench"),
    (["bench", "out/", "--rounds", "many"], "'--rounds'", "xformopt bench"),
    (["bench", "out/", "--rounds", "1"], "'--rounds'", "xformopt bench"),
    (["bench", "out/", "--max-accuracy-drop", "lots"], "max_accuracy_drop must be points", "xformopt bench"),
    (["quantize", "f/", "-o", "q/", "--max-accuracy-drop", "-1"], "--max-accuracy-drop", "xformopt quantize"),
    (["optimize", "--target"], "'--target' requires an argument", "xformopt optimize"),
    (["recipes", "show"], "Missing argument 'RECIPE'", "xformopt recipes show"),
    (["frobnicate"], "No such command 'frobnicate'", "xformopt"),
    (["fuse", "e/", "-o", "f/", "--select", "most"], "'most' is not one of 'fastest', 'all', 'none'", "xformopt fuse"),
    (["quantize", "f/", "-o", "q/", "--mode", "fixed"], "'fixed' is not one of 'dynamic', 'static'", "xformopt quantize"),
], ids=["unknown-option", "missing-argument", "bad-int", "int-out-of-range", "bad-budget", "negative-budget",
        "missing-value", "missing-argument-subgroup", "unknown-command", "bad-choice", "bad-choice-mode"])
def test_usage_error_is_one_line_naming_the_help(args, fragment, command, capsys):
    code, out, err = run_cli(args, capsys)
    line = one_error_line(code, err)
    assert fragment in line
    assert line.endswith(f"see `{command} --help`")
    assert "╭" not in err and "Usage:" not in err  # not Click's boxed usage message
    assert out == ""


# --------------------------------------------------------------------------- flags


@pytest.mark.parametrize("command", LEAF_COMMANDS, ids=" ".join)
def test_every_command_takes_quiet_after_it_and_shows_no_bool_metavar(command, capsys):
    code, out, _ = run_cli([*command, "--help"], capsys)
    assert code == 0
    assert "--quiet" in out and "-q" in out
    assert "<bool>" not in out
    options = out[out.index("Options"):]
    assert re.findall(r"<[a-z]+[^>]*>", options) == []  # values named TEXT/N/PATH/FILE or a|b, as DIR and FILE
    for line in options.splitlines():  # data files are FILE, folders DIR, on every command
        if re.match(r" {1,6}--(data|train-data|eval-data|validation-data|calibration-data|budget-data|unlabeled-data)(?=\s)", line):
            assert re.match(r" +--[a-z-]+ FILE ", line), line
        if re.match(r" {1,6}--(teacher|checkpoint-dir)(?=\s)", line):
            assert re.match(r" +--[a-z-]+ DIR ", line), line
    assert re.search(r"^ {1,6}--data FILE ", out, re.M) or "--data" not in out
    usage = next(line for line in out.splitlines() if "Usage:" in line)
    assert "{" not in usage  # arguments as MODEL / DIR / RECIPE, not {dir} or [model]
    args = re.findall(r"\b[a-z_]+\b", usage.split("[OPTIONS]")[-1])
    assert args == [], usage


def test_quiet_after_the_command_silences_logs(capsys):
    code, out, err = run_cli(["targets", "detect"], capsys)
    assert code == 0 and err.strip()  # the CPU facts go to stderr as a log line
    code, quiet_out, quiet_err = run_cli(["targets", "detect", "-q"], capsys)
    assert code == 0 and quiet_err == "" and quiet_out == out
    output.set_quiet(False)


@pytest.mark.parametrize("args", [["cache", "list"], ["cache", "verify"], ["cache", "prune", "--older-than", "1s"],
                                  ["cache", "clear"]], ids=" ".join)
def test_cache_commands_take_quiet_after_them(args, capsys):
    code, out, err = run_cli([*args, "-q", "--json"], capsys)
    assert code == 0 and err == ""
    assert "root" in json.loads(out)
    output.set_quiet(False)


def test_argument_metavars_are_consistent(capsys):
    names = {}
    for command in LEAF_COMMANDS:
        _, out, _ = run_cli([*command, "--help"], capsys)
        usage = next(line for line in out.splitlines() if "Usage:" in line)
        names[" ".join(command)] = usage.split("[OPTIONS]")[-1].split()
    assert names["optimize"] == ["[MODEL]"]
    assert names["export"] == names["prune"] == names["distill"] == ["MODEL"]
    assert names["fuse"] == names["quantize"] == names["bench"] == names["report"] == ["DIR"]
    assert names["generate"] == ["DIR", "[PROMPT]"]  # optional: --chat instead


def test_optimize_mode_is_a_deprecated_alias_of_latency_mode(tmp_path, capsys):
    missing = tmp_path / "nowhere"
    code, _, err = run_cli(["optimize", missing, "--mode", "real", "-o", tmp_path / "out"], capsys)
    assert code == 2
    assert error_lines(err) == [
        "xformopt: warning: `optimize --mode` is deprecated, use --latency-mode (`quantize --mode` is dynamic/static)",
        f"error: model path not found: {missing}",
    ]
    code, _, err = run_cli(["optimize", missing, "--mode", "real", "--latency-mode", "fixed"], capsys)
    assert "give only --latency-mode" in one_error_line(code, err)
    _, out, _ = run_cli(["optimize", "--help"], capsys)
    assert "--latency-mode" in out and "--mode " not in out  # the old name is hidden


@pytest.mark.parametrize("command, flag, options, field", [
    ("fuse", "--select", "xformopt.passes.fuse.run:FuseOptions", "select"),
    ("quantize", "--mode", "xformopt.passes.quantize.run:QuantizeOptions", "mode"),
    ("quantize", "--calibration-method", "xformopt.passes.quantize.run:QuantizeOptions", "calibration_method"),
    ("int4", "--algorithm", "xformopt.passes.int4.run:Int4Options", "algorithm"),
    ("prune", "--strategy", "xformopt.passes.prune.run:PruneOptions", "strategy"),
    ("prune", "--importance", "xformopt.passes.prune.run:PruneOptions", "importance"),
    ("distill", "--device", "xformopt.passes.distill.options:DistillOptions", "device"),
])
def test_cli_choices_are_the_pass_options_choices(command, flag, options, field):
    """The CLI states the choices (help shows them, a typo is a usage error); they must be the pass's."""
    import importlib
    import typing

    import typer

    from xformopt.cli.app import app

    module, name = options.split(":")
    expected = typing.get_args(getattr(importlib.import_module(module), name).model_fields[field].annotation)
    click_command = typer.main.get_command(app).commands[command]
    (param,) = [p for p in click_command.params if flag in getattr(p, "opts", ())]
    assert "|".join(expected) in param.display_type_rich(None)


def test_distill_data_help_is_about_distill():
    import typer

    from xformopt.cli.app import app

    def data_help(command: str) -> str:
        (param,) = [p for p in typer.main.get_command(app).commands[command].params if "--data" in p.opts]
        return param.help

    assert "dropped from training and evaluation" in data_help("distill")
    assert data_help("distill") != data_help("export")  # no longer the parity-check text of the ONNX passes


@pytest.mark.parametrize("target", ["avx2", "avx512", "avx512_vnni", "avx_vnni", "arm64"])
@pytest.mark.parametrize("recipe_name", ["default", "int8-static"])
def test_recipes_show_resolved_says_what_the_target_decides(recipe_name, target, capsys):
    import yaml

    from xformopt.targets import PROFILES

    code, out, _ = run_cli(["recipes", "show", recipe_name, "--resolved", "--target", target], capsys)
    assert code == 0
    data = yaml.safe_load(out)
    (quantize,) = [step["quantize"] for step in data["passes"] if "quantize" in step]
    q = PROFILES[target].quant
    assert data["target"] == target
    assert quantize["per_channel"] is q.per_channel
    assert quantize["reduce_range"] is q.reduce_range
    assert quantize["op_types"] == list(q.op_types)
    if quantize["mode"] == "static":
        assert quantize["quant_format"] == q.quant_format and quantize["activation_type"] == q.activation_type
    assert quantize["weight_type"] == q.weight_type
    assert None not in (quantize["per_channel"], quantize["reduce_range"], quantize["quant_format"],
                        quantize["weight_type"])


def test_recipes_show_resolved_leaves_int4_steps_without_int8_formats(capsys):
    import yaml

    code, out, _ = run_cli(["recipes", "show", "int4", "--resolved", "--target", "avx2"], capsys)
    assert code == 0
    (int4,) = [step["int4"] for step in yaml.safe_load(out)["passes"] if "int4" in step]
    assert int4["block_size"] == 32 and not {"mode", "per_channel", "weight_type", "op_types"} & set(int4)


def test_recipes_show_target_needs_resolved(capsys):
    code, _, err = run_cli(["recipes", "show", "default", "--target", "avx2"], capsys)
    assert "--resolved" in one_error_line(code, err)


# --------------------------------------------------------------------------- one accuracy-budget parser


@pytest.mark.parametrize("text, parsed", [("0.5", 0.5), ("1%", "1%"), (" 2.5 % ", "2.5%"), (0, 0.0)])
def test_budget_parser_accepts_points_and_percentages(text, parsed):
    from xformopt.accuracy_budget import parse

    assert parse(text) == parsed


@pytest.mark.parametrize("text", ["-1", "abc", "nan", "inf", "1%%", True])
def test_budget_parser_refuses_the_rest(text):
    from xformopt.accuracy_budget import parse

    with pytest.raises(ValueError, match="max_accuracy_drop must be"):
        parse(text)


def test_bench_gate_reads_a_relative_budget_against_the_baseline():
    from xformopt.benchmarking.gate import metric_check

    old = {"accuracy": {"value": 0.80}}
    # 1% of 80 accuracy points is 0.8 points: a drop of 0.7 points passes, one of 0.9 fails.
    ok = metric_check("accuracy", old, {"accuracy": {"value": 0.793}}, "1%")
    bad = metric_check("accuracy", old, {"accuracy": {"value": 0.791}}, "1%")
    assert ok["limit"] == pytest.approx(0.8) and ok["verdict"] == "pass"
    assert bad["verdict"] == "regression" and "1% of the baseline" in bad["message"]
    assert metric_check("accuracy", old, {"accuracy": {"value": 0.791}}, 1.0)["verdict"] == "pass"


def test_quantize_and_bench_share_the_parser():
    from xformopt.passes.quantize.run import QuantizeOptions

    assert QuantizeOptions(max_accuracy_drop="1%").max_accuracy_drop == "1%"
    with pytest.raises(ValueError, match="max_accuracy_drop must be points"):
        QuantizeOptions(max_accuracy_drop="1x")


# --------------------------------------------------------------------------- progress


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_line_sink_prints_periodic_lines_with_eta(monkeypatch, capsys):
    clock = FakeClock()
    monkeypatch.setattr(output, "clock", clock)
    output.set_quiet(False)
    sink = output.LineSink(every=10)
    with progress.listening(sink):
        for done, now in [(0, 0), (1, 4), (2, 11), (3, 15), (4, 22), (10, 40)]:
            clock.now = now
            progress.report("evaluating fused (rows)", done, 10, "")
        clock.now = 41
        progress.report("a short step", 5, 5)  # ends before any line was due: stays silent
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert lines == [
        "xformopt: evaluating fused (rows): 2/10 (20%), ETA 44s",
        "xformopt: evaluating fused (rows): 4/10 (40%), ETA 33s",
        "xformopt: evaluating fused (rows): 10/10 (100%), done in 40s",
    ]


def test_bar_sink_draws_a_live_bar_with_eta_on_a_terminal(monkeypatch):
    from rich.console import Console

    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=120)
    output.set_quiet(False)
    sink = output.BarSink(console)
    assert sink.interactive
    with progress.listening(sink):
        assert progress.interactive()
        tick = progress.tracker("latency (quantize alone, 5 repeats)", 500)
        for done in range(1, 251):
            tick(done)
        sink.bars.refresh()
        drawn = screen.getvalue()
        assert "latency (quantize alone, 5 repeats)" in drawn and "250/500" in drawn and "ETA" in drawn
        tick(500)
        assert sink.bars is None  # the last step finished: the live display stops until the next one


def test_quiet_draws_nothing(capsys):
    from rich.console import Console

    screen = io.StringIO()
    output.set_quiet(True)
    try:
        with progress.listening(output.BarSink(Console(file=screen, force_terminal=True))):
            progress.report("x", 1, 2)
        with progress.listening(output.LineSink(every=1e-9)):
            progress.report("x", 1, 2)
            progress.report("x", 2, 2)
    finally:
        output.set_quiet(False)
    assert screen.getvalue() == "" and capsys.readouterr().err == ""


def test_solo_repeats_report_progress_across_all_repeats():
    from xformopt.measure import modes

    calls = []
    with progress.listening(None):
        modes.solo_repeats(lambda texts, pairs: None, ["a", "b"], None, rounds=4, warmup=0, repeats=3,
                           progress=lambda done, total: calls.append((done, total)))
    assert calls[0] == (1, 12) and calls[-1] == (12, 12)
    assert [d for d, _ in calls] == list(range(1, 13))  # not 4/4 three times over


def test_lower_layers_do_not_import_the_cli():
    offenders = []
    for path in (ROOT / "xformopt").rglob("*.py"):
        if path.parts[-2] == "cli":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.startswith("xformopt.cli")]
    assert offenders == []


def test_finetune_example_logs_progress_when_stderr_is_not_a_terminal(tiny_classifier, monkeypatch, capsys):
    """examples/sentiment/finetune.py: step, epoch, loss and ETA lines instead of 26 silent minutes."""
    import argparse
    import importlib.util

    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    spec = importlib.util.spec_from_file_location("finetune", ROOT / "examples" / "sentiment" / "finetune.py")
    finetune = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(finetune)
    clock = FakeClock()
    monkeypatch.setattr(output, "clock", clock)
    original = finetune.progress.report

    def ticking(*args, **kwargs):  # every report is 1 s later: lines fall due without sleeping
        clock.now += 1.0
        original(*args, **kwargs)

    monkeypatch.setattr(finetune.progress, "report", ticking)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_classifier)
    tokenizer = AutoTokenizer.from_pretrained(tiny_classifier)
    texts, labels = finetune.load_split("train")
    args = argparse.Namespace(batch_size=8, epochs=2, lr=1e-4, max_length=32, seed=0, log_every=3.0)
    output.set_quiet(False)
    capsys.readouterr()
    with output.progress_display(every=args.log_every):
        finetune.train(model, tokenizer, texts[:48], labels[:48], args)
    lines = [line for line in capsys.readouterr().err.splitlines() if "fine-tuning" in line]
    assert len(lines) >= 3
    assert re.search(r"fine-tuning \(steps\): \d+/12 \(\d+%\), epoch [12]/2, loss \d\.\d{4}, ETA \d+s", lines[0]), lines[0]
    assert "epoch 2/2" in lines[-1] and "12/12" in lines[-1] and "done in" in lines[-1]


# --------------------------------------------------------------------------- pipelines of single-pass commands


@pytest.fixture(scope="module")
def chain(tmp_path_factory, tiny_classifier):
    """`xformopt export M -o e/ && xformopt fuse e/ -o f/ && xformopt quantize f/ -o q/` on a tiny model."""
    from xformopt.cli.app import main

    root = tmp_path_factory.mktemp("chain")
    for args in (["export", tiny_classifier, "-o", root / "e"], ["fuse", root / "e", "-o", root / "f", "-q"],
                 ["quantize", root / "f", "-o", root / "q"]):
        try:
            main([str(a) for a in args])
        except SystemExit as exc:
            assert exc.code in (0, None), args
    return root


BENCH_FAST = ["--limit", "24", "--rounds", "5", "--repeats", "2", "--warmup", "1"]


def test_bench_measures_a_single_pass_chain(chain, capsys, monkeypatch):
    monkeypatch.setenv("XFORMOPT_PROGRESS_EVERY", "1e-9")  # every report falls due: the lines must exist
    code, out, err = run_cli(["bench", chain / "q", *BENCH_FAST, "--limit", "80", "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["artifact"]["stage"] == "quantize"
    assert doc["model"]["task"] == "text-classification" and doc["headline_metric"] == "accuracy"
    lat = doc["artifact"]["latency"]
    assert lat["median_ms"] > 0 and len(lat["repeat_medians_ms"]) == 2 and lat["n"] == 10
    assert 0.0 <= doc["artifact"]["metrics"]["accuracy"]["value"] <= 1.0  # labels of the vendored split
    assert doc["settings"]["heldout"]["rows"] == 80
    assert any("no baseline stages" in n for n in doc["notes"])
    assert any("agreement_with_baseline skipped" in n for n in doc["notes"])
    comparison = doc["comparison"]
    assert comparison["gated"] is False and comparison["checks"] == [] and "no report.json" in comparison["reason"]
    # Non-terminal stderr: the evaluation and the solo repeats print plain progress lines.
    assert "xformopt: evaluating the artifact (rows): 64/80 (80%), ETA" in err
    assert "xformopt: evaluating the artifact (rows): 80/80 (100%), done in" in err
    assert "xformopt: latency (alone, 2 repeats): 10/10 (100%), done in" in err


def test_bench_human_output_says_what_it_cannot(chain, capsys):
    code, out, err = run_cli(["bench", chain / "q", *BENCH_FAST, "-q"], capsys)
    assert code == 0 and err == ""
    flat = " ".join(out.split())
    assert "latency median" in flat and "accuracy" in flat
    assert "no baseline stages to compare with" in flat
    assert "pass --baseline FILE" in flat


def test_bench_gates_a_chain_against_its_own_earlier_bench(chain, tmp_path, capsys):
    first = tmp_path / "bench.json"
    code, _, err = run_cli(["bench", chain / "q", *BENCH_FAST, "-o", first, "-q"], capsys)
    assert code == 0, err
    code, out, err = run_cli(["bench", chain / "q", *BENCH_FAST, "--baseline", first, "--json",
                              "--max-latency-regression", ANY_LATENCY_DRIFT, "--max-accuracy-drop", "1%"], capsys)
    assert code == 0, err
    comparison = json.loads(out)["comparison"]
    assert comparison["gated"] and comparison["passed"]
    accuracy = next(c for c in comparison["checks"] if c["name"] == "accuracy")
    assert accuracy["verdict"] == "pass" and accuracy["limit_relative"] == "1%"
    assert accuracy["limit"] == pytest.approx(accuracy["baseline"])  # 1% of (100 x value) points


def test_bench_gates_an_embeddings_chain_on_latency_alone_and_says_so(tiny_encoder, tmp_path, capsys):
    # An embeddings chain has no fp32 reference outputs, so neither bench has its headline metric:
    # `bench --baseline` of its own `-o` gates latency alone (was exit 2 with a fix that cannot apply).
    for args in (["export", tiny_encoder, "-o", tmp_path / "e", "-q"], ["fuse", tmp_path / "e", "-o", tmp_path / "f", "-q"],
                 ["quantize", tmp_path / "f", "-o", tmp_path / "q", "-q"]):
        assert run_cli(args, capsys)[0] == 0, args
    first = tmp_path / "bench.json"
    code, _, err = run_cli(["bench", tmp_path / "q", *BENCH_FAST, "-o", first, "-q"], capsys)
    assert code == 0, err
    code, out, err = run_cli(["bench", tmp_path / "q", *BENCH_FAST, "--baseline", first, "-q",
                              "--max-latency-regression", ANY_LATENCY_DRIFT], capsys)
    assert code == 0, err
    flat = " ".join(out.split())
    assert "cosine_to_baseline not gated: neither run has it" in flat and "gate passed" in flat
    code, out, _ = run_cli(["bench", tmp_path / "q", *BENCH_FAST, "--baseline", first, "--json", "-q",
                            "--max-latency-regression", ANY_LATENCY_DRIFT], capsys)
    comparison = json.loads(out)["comparison"]
    assert comparison["gated"] and comparison["passed"] and "neither run has it" in comparison["latency_only"]
    assert {c["name"]: c["verdict"] for c in comparison["checks"]} == {"latency_median_ms": "pass",
                                                                      "cosine_to_baseline": "skipped"}


def test_bench_refuses_a_torch_stage_with_the_way_on(chain, tiny_classifier, tmp_path, capsys):
    code, _, err = run_cli(["bench", tiny_classifier], capsys)
    assert code == 2  # a plain model folder: no manifest at all
    pruned = tmp_path / "p"
    code, _, err = run_cli(["prune", tiny_classifier, "-o", pruned, "--layers", "1", "--no-latency",
                            "--importance", "magnitude", "-q"], capsys)
    assert code == 0, err
    code, _, err = run_cli(["bench", pruned], capsys)
    line = one_error_line(code, err)
    assert "no model.onnx" in line and "xformopt export" in line and "NEW_DIR" in line


def test_report_renders_a_single_pass_chain(chain, capsys):
    code, out, err = run_cli(["report", chain / "q"], capsys)
    assert code == 0, err
    for name in ("export", "fuse", "quantize"):
        assert name in out
    assert "xformopt bench" in " ".join(err.split())  # says how to get the numbers it does not have
    code, out, _ = run_cli(["report", chain / "q", "--markdown", "-q"], capsys)
    assert code == 0
    rows = [line for line in out.splitlines() if line.startswith("| ")]
    assert [r.split("|")[1].strip() for r in rows[1:]] == ["export", "fuse", "quantize"]
    assert "parity max\\|diff\\|" in rows[1] and "weighted GEMMs in INT8" in rows[3]  # pipes escaped
    code, out, _ = run_cli(["report", chain / "q", "--json", "-q"], capsys)
    passes = json.loads(out)["passes"]
    assert code == 0 and [p["pass"] for p in passes] == ["export", "fuse", "quantize"]
    # every single-pass command records its own peak memory, and the Markdown shows it per pass
    for entry, row in zip(passes, rows[1:]):
        assert 0 < entry["memory"]["start_rss_mb"] <= entry["memory"]["peak_rss_mb"] < 64 * 1024
        assert row.split("|")[3].strip() == f"{entry['memory']['peak_rss_mb']:,.0f}"
    assert not (chain / "q" / "report.md").exists()  # report renders; it writes nothing into a stage


def test_report_on_an_empty_folder_suggests_a_new_output(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    code, _, err = run_cli(["report", tmp_path / "empty"], capsys)
    line = one_error_line(code, err)
    assert "NEW_DIR" in line and f"-o {tmp_path / 'empty'}" not in line  # not a fix that hits "already exists"


# --------------------------------------------------------------------------- help at 80 columns (issue 21)

SECTION = re.compile(r"^\s*(╭─ )?(Arguments|Options|Commands)\b")


def unreadable(text: str, width: int = 80, narrowest: int = 30) -> list[str]:
    """What makes help TEXT hard to read at WIDTH columns: lines past it, descriptions wrapped into a
    column narrower than NARROWEST, and runs of one-word lines (a squeezed table)."""
    problems, in_section, single_run = [], False, 0
    for number, raw in enumerate(text.splitlines(), start=1):
        if len(raw) > width:
            problems.append(f"line {number} is {len(raw)} columns: {raw!r}")
        line = raw.strip("│╭╮╰╯ \t") and raw.replace("│", " ").rstrip()
        if SECTION.match(raw):
            in_section = True
            continue
        if not raw.strip() or raw.lstrip().startswith("╰"):
            in_section = False
        words = line.split()
        single_run = single_run + 1 if len(words) == 1 and len(line) - len(line.lstrip()) > 10 else 0
        if single_run == 3:
            problems.append(f"line {number}: one word per line from line {number - 2}")
        if in_section and words:
            indent = len(line) - len(line.lstrip())
            gap = re.search(r"\S\s{2,}(?=\S)", line[indent:])
            start = indent if indent > 4 else (indent + gap.end() if gap else None)
            if start is not None and width - start < narrowest:
                problems.append(f"line {number}: description squeezed into {width - start} columns: {raw!r}")
    return problems


def every_command() -> list[list[str]]:
    import typer

    from xformopt.cli.app import app

    def walk(command, path):
        yield path
        for name, sub in getattr(command, "commands", {}).items():
            yield from walk(sub, [*path, name])

    return list(walk(typer.main.get_command(app), []))


def test_the_readability_check_catches_the_squeezed_table():
    """The check itself, on lines of the help that issue 21 reported (rich's table at 80 columns)."""
    squeezed = """\
╭─ Options ────────────────────────────────────────────────────────────────────╮
│ --target             -t                      TEXT        Hardware profile    │
│                                                          (auto, avx2,        │
│                                                          avx512,             │
│                                                          avx512_vnni,        │
│                                                          avx_vnni, arm64)    │
│ --task                                       TEXT        One of:             │
│                                                          text-classificatio… │
│                                                          feature-extraction, │
│                                                          text-generation,    │
╰──────────────────────────────────────────────────────────────────────────────╯"""
    problems = unreadable(squeezed)
    assert "line 3: description squeezed into 21 columns" in problems[0]
    assert any(p.startswith("line 10: one word per line from line 8") for p in problems), problems
    assert unreadable("x" * 81) == [f"line 1 is 81 columns: {'x' * 81!r}"]


@pytest.mark.parametrize("columns", ["80", "200"])
@pytest.mark.parametrize("command", every_command(), ids=lambda c: " ".join(c) or "xformopt")
def test_help_of_every_command_reads_at_80_columns(command, columns, capsys, monkeypatch):
    """Every command and group, as a pipe sees it (capsys is not a terminal) with COLUMNS=80 (and a
    wide setting: the text still stops at 80, where it reads best)."""
    monkeypatch.setenv("COLUMNS", columns)
    code, out, _ = run_cli([*command, "--help"], capsys)
    assert code == 0
    assert out.startswith(f"Usage: xformopt {' '.join(command)}".replace("  ", " ").rstrip())
    assert unreadable(out) == [], out
    assert "╭" not in out and "│" not in out  # one plain layout in a terminal, a pipe or a file


def test_long_example_lines_continue_as_shell_lines():
    from xformopt.cli import help_text

    line = ("xformopt optimize ./my-bert -o out/ --json | jq '.stages[] | {name, speedup}' --data a-long-file-name.csv"
            "   # the comment")
    rows = help_text.code_lines(line, 60)
    assert rows[0] == "# the comment"
    assert all(len(r) <= 60 for r in rows)
    assert all(r.endswith(" \\") for r in rows[1:-1]) and not rows[-1].endswith("\\")
    assert " ".join(r.removesuffix(" \\").strip() for r in rows[1:]) == line.split("   #")[0]  # same words, in order
    assert any("'.stages[] | {name, speedup}'" in r for r in rows)  # never split inside quotes


@pytest.mark.parametrize("command", [["optimize"], []], ids=["optimize", "xformopt"])
def test_help_in_an_80_column_terminal(command):
    """A real terminal (a pty of 80 columns, no COLUMNS): the same readable plain text."""
    import fcntl
    import os
    import pty
    import struct
    import subprocess
    import sys
    import termios

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    done = subprocess.run([sys.executable, "-m", "xformopt.cli.app", *command, "--help"], stdin=follower,
                          stdout=follower, stderr=subprocess.PIPE, env=env, timeout=120)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the terminal closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    out = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", b"".join(chunks).decode()).replace("\r\n", "\n")
    assert done.returncode == 0, done.stderr
    assert "Usage: xformopt" in out and "Options:" in out
    assert unreadable(out) == [], out


def _finetune_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("finetune", ROOT / "examples" / "sentiment" / "finetune.py")
    finetune = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(finetune)
    return finetune


def test_finetune_example_reads_another_tasks_splits_and_refuses_bad_ones_before_any_work(tmp_path, capsys):
    """--data-dir: another task's train/validation rows (issue 53's second teacher); bad ones exit 2, nothing written."""
    finetune = _finetune_module()
    data = tmp_path / "task"
    data.mkdir()
    rows = [{"text": f"text {i}", "label": ("negative", "positive")[i % 2]} for i in range(6)]
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (data / "validation.jsonl").write_text(json.dumps(rows[0]) + "\n")
    texts, labels = finetune.load_split("train", data)
    assert texts == [r["text"] for r in rows] and labels == [0, 1, 0, 1, 0, 1]

    out = tmp_path / "model"
    (data / "validation.jsonl").write_text(json.dumps({"text": "x", "label": "neutral"}) + "\n")
    assert finetune.main(["--data-dir", str(data), "--output", str(out)]) == 2
    assert "labels ['neutral'] are not negative/positive" in capsys.readouterr().err
    (data / "validation.jsonl").unlink()
    assert finetune.main(["--data-dir", str(data), "--output", str(out)]) == 2
    assert "validation.jsonl" in capsys.readouterr().err
    assert not out.exists()
