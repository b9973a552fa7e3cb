"""Report rendering (console, Markdown, plots) and `xformopt report`, on hand-built report dicts: no models."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from rich.console import Console

from xformopt.logs import forwarded_to
from xformopt.report import plots
from xformopt.report.console import console_table
from xformopt.report.markdown import markdown
from xformopt.report.render import write_report_files
from xformopt.report.schema import REPORT_SCHEMA

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# Long stage names on purpose: they must never be cut, even at 80 columns.
STAGES = ["pytorch", "export", "fuse", "quantize_dynamic_int8_per_channel"]
FUSED = {"Attention": 6, "EmbedLayerNormalization": 1, "SkipLayerNormalization": 12, "BiasGelu": 6}


def _latency(median: float) -> dict:
    return {
        "n": 100, "median_ms": median, "p90_ms": median * 1.6, "p99_ms": median * 2.1, "mean_ms": median * 1.1,
        "std_ms": median * 0.3, "min_ms": median * 0.6, "throughput_per_s": 1000 / (median * 1.1),
    }


def _proportion(value: float, n: int = 500) -> dict:
    half = 1.96 * (value * (1 - value) / n) ** 0.5
    return {"value": value, "n": n, "ci95": [value - half, min(1.0, value + half)]}


def make_report(task: str = "text-classification", fixed: bool = False, throughput: bool = False,
                names: list[str] = STAGES, model_call: bool = False) -> dict:
    """A complete xformopt.report/1 document as build_report writes it (values made up)."""
    medians = [19.9, 10.2, 9.8, 4.5]
    sizes = [90_868_376, 90_362_391, 90_277_088, 23_559_228]
    stages = []
    for i, (name, median, size) in enumerate(zip(names, medians, sizes)):
        if task == "text-classification":
            acc = [0.912, 0.912, 0.912, 0.908][i]
            metrics = {
                "accuracy": _proportion(acc),
                "macro_f1": {"value": acc - 0.007, "n": 500, "ci95": [acc - 0.03, acc + 0.02]},
                "agreement_with_baseline": _proportion([1.0, 1.0, 1.0, 0.984][i]),
            }
        else:
            cos = [1.0, 0.9999999, 0.9999998, 0.9921][i]
            metrics = {
                "cosine_to_baseline": {"value": cos, "n": 200, "stderr": (1 - cos) / 50, "p1": cos - (1 - cos) * 0.8},
                "probe_accuracy": {**_proportion([0.62, 0.62, 0.62, 0.605][i], 100), "train_rows": 100},
            }
        base = stages[0]["metrics"] if stages else metrics
        row = {
            "name": name,
            "kind": "pytorch" if i == 0 else "onnx",
            "size_bytes": size,
            "metrics": metrics,
            "delta_to_baseline": {k: m["value"] - base[k]["value"] for k, m in metrics.items()},
            "latency": _latency(median),
            "speedup": medians[0] / median,
            "memory": {},
        }
        if i >= 1:
            row["graph"] = {}
        if i >= 2:
            row["graph"].update({
                "fused_ops": FUSED, "fusion_kept": "all",
                "fusion_reason": "within 5% of the fastest, and more fused (median at batch 1: none 8.97 ms, all 9.10 ms)",
            })
        if i >= 3:
            row["graph"].update({"int8_gemms": 24, "weighted_gemms": 26, "float_gemms": ["classifier", "pooler.dense"]})
        stages.append(row)
    report = {
        "schema": REPORT_SCHEMA,
        "created": "2026-01-01T00:00:00+00:00",
        "model": {"source": "minilm", "model_type": "bert", "task": task},
        "target": "avx512_vnni",
        "target_on_host": True,
        "headline_metric": "accuracy" if task == "text-classification" else "cosine_to_baseline",
        "settings": {
            "mode": "real", "batch": 1, "threads": 2, "heldout": {"path": "test.jsonl", "source": "test.jsonl", "rows": 500},
            "rounds": 100, "warmup": 10, "repeats": 5, "seed": 0, "thread_pools": "no spin-waiting",
        },
        "host": {
            "cpu_model": "Intel(R) Xeon(R) Processor", "machine": "x86_64", "cpu_flags": ["avx2", "avx512_vnni"], "int8_gemm_saturates": False,
            "cores_logical": 2, "cores_usable": 2, "memory_total_gb": 25.3, "os": "Linux", "python": "3.11.7",
            "versions": {"onnxruntime": "1.32.0", "torch": "2.13.0+cpu"}, "onnxruntime_providers": ["CPUExecutionProvider"],
        },
        "host_fingerprint": "c1f351aa1f6a3b12",
        "stages": stages,
        "artifact": {
            "stage": names[-1],
            "latency": {**_latency(3.1), "n": 500, "repeats": 5,
                        "repeat_medians_ms": [3.3, 3.2, 3.1, 3.05, 3.0], "spread_ms": 0.15},
            "metrics": stages[-1]["metrics"],
        },
    }
    if fixed:
        report["fixed"] = [
            {"stage": name, "batch": b, "seq": s, **_latency(m * b * s / 32)}
            for b in (1, 8) for s in (32, 128, 512) for name, m in zip(names, medians)
        ]
    if model_call:  # the model call alone: 1 ms less than end to end (tokenization)
        report["model_call"] = {name: _latency(m - 1.0) for name, m in zip(names, medians)}
    if throughput:
        report["throughput"] = {
            name: {"samples_per_s": 1000 / m * 1.5, "best_batch": 8, "by_batch": {"1": 1000 / m, "8": 1000 / m * 1.5}}
            for name, m in zip(names, medians)
        }
    return report


def render_text(report: dict, width: int) -> str:
    console = Console(width=width, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(console_table(report))
    return console.export_text()


# --------------------------------------------------------------------------- markdown


@pytest.mark.parametrize("task", ["text-classification", "feature-extraction"])
def test_markdown_headline_table_and_stages(task):
    report = make_report(task, fixed=True, throughput=True)
    text = markdown(report)
    assert text.startswith("### xformopt: minilm")
    label = "Accuracy" if task == "text-classification" else "Cosine to fp32"
    assert f"| Stage | Size (MB) | {label} |" in text
    headline = text.split("<details>")[0]
    rows = [line for line in headline.splitlines() if line.startswith("| ") and not line.startswith("| Stage")]
    assert [r.split("|")[1].strip() for r in rows] == STAGES
    assert "100 interleaved rounds" in text
    assert "<details>" in text and "</details>" in text
    assert "#### Fixed shapes" in text and "#### Throughput" in text
    assert text.index("| Stage | Size (MB)") < text.index("<details>")
    if task == "text-classification":
        assert "90.8% \u00b12.5 (\u22120.4 pt)" in text  # value, CI half-width, delta
    else:
        assert "0.9921 (p1 0.9858)" in text


def test_model_call_section_in_markdown_and_console():
    report = make_report(model_call=True)
    text = markdown(report)
    section = text.split("#### The model call alone (texts tokenized beforehand)")[1].split("####")[0]
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in section.splitlines() if line.startswith("| ") and not line.startswith("| Stage")}
    assert list(rows) == STAGES
    assert rows["pytorch"][:4] == ["18.90", "30.24", "1.00×", "19.90"]  # p50, p90, speedup, end to end
    assert rows[STAGES[-1]][2] == "5.40×" and rows[STAGES[-1]][4] == "1.00"  # 18.9 / 3.5; 4.5 - 3.5 ms
    console = render_text(report, 100)
    assert "Model call alone" in console and max(len(line.rstrip()) for line in console.splitlines()) <= 100
    assert "Model call alone" not in render_text(make_report(), 100)


def test_markdown_default_report_has_one_table():
    """Without fixed/throughput, the only '| '-table is the headline (test_pipeline relies on it)."""
    text = markdown(make_report())
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| Stage")]
    assert [r.split("|")[1].strip() for r in rows] == STAGES
    assert "![" not in text  # no images unless they were written


def test_markdown_warns_when_target_not_on_host():
    report = make_report()
    report["target_on_host"] = False
    assert "[!WARNING]" in markdown(report)


# --------------------------------------------------------------------------- console


@pytest.mark.parametrize("width", [80, 100, 60])
@pytest.mark.parametrize("task", ["text-classification", "feature-extraction"])
def test_console_rendering_keeps_stage_names(width, task):
    report = make_report(task, fixed=True, throughput=True)
    text = render_text(report, width)
    for name in STAGES:
        assert name in text, f"{name!r} cut at width {width}"
    assert "Graph" in text and "Fixed shapes" in text and "Throughput" in text
    assert "Artifact alone" in text
    if width >= 80:
        assert max(len(line.rstrip()) for line in text.splitlines()) <= width
        assert "\u2026" not in text  # nothing truncated with an ellipsis


def test_console_headline_at_100_and_80_columns():
    """Usual stage names: everything at 100 columns; at 80 the headline keeps its CI and delta."""
    report = make_report(names=["pytorch", "export", "fuse", "quantize"])
    wide = render_text(report, 100)
    header = [line for line in wide.splitlines() if line.startswith("Stage")][0]
    assert all(h in header for h in ("Size MB", "Accuracy", "Macro-F1", "Agreement", "p50 ms", "p90 ms", "p99 ms", "Speedup"))
    assert "90.8% \u00b12.5 (\u22120.4 pt)" in wide and "0.901 (\u22120.004)" in wide
    narrow = render_text(report, 80)
    assert "90.8% \u00b12.5 (\u22120.4 pt)" in narrow and "Macro-F1" in narrow
    assert max(len(line.rstrip()) for line in narrow.splitlines()) <= 80


def test_console_without_optional_sections():
    report = make_report()
    del report["artifact"]
    for row in report["stages"]:
        row.pop("graph", None)
    text = render_text(report, 80)
    assert all(name in text for name in STAGES)
    assert "Graph" not in text and "Artifact alone" not in text


# --------------------------------------------------------------------------- plots and files


@pytest.mark.parametrize("fixed", [False, True])
@pytest.mark.parametrize("task", ["text-classification", "feature-extraction"])
def test_plots_are_png(tmp_path, fixed, task):
    written = plots.write_plots(make_report(task, fixed=fixed), tmp_path)
    names = sorted(p.name for p in written)
    assert names == (["accuracy_latency.png", "latency_seq.png"] if fixed else ["accuracy_latency.png"])
    for path in written:
        assert path.read_bytes()[:8] == PNG_MAGIC


def test_write_report_files(tmp_path):
    report = make_report(fixed=True, throughput=True)
    written = write_report_files(report, tmp_path)
    assert {p.name for p in written} == {"report.json", "report.md", "accuracy_latency.png", "latency_seq.png"}
    assert json.loads((tmp_path / "report.json").read_text()) == report
    md = (tmp_path / "report.md").read_text()
    assert "](accuracy_latency.png)" in md and "](latency_seq.png)" in md


def test_plot_failure_keeps_json_and_markdown(tmp_path, monkeypatch):
    def boom(report, directory, **kwargs):
        raise RuntimeError("no plotting today")

    monkeypatch.setattr(plots, "write_plots", boom)
    messages: list[str] = []
    with forwarded_to(messages.append):
        written = write_report_files(make_report(), tmp_path)
    assert {p.name for p in written} == {"report.json", "report.md"}
    assert (tmp_path / "report.json").is_file() and "| Stage |" in (tmp_path / "report.md").read_text()
    assert "![" not in (tmp_path / "report.md").read_text()
    assert any("no plotting today" in m for m in messages)


# --------------------------------------------------------------------------- xformopt report


def _cli(args: list[str]) -> int:
    from xformopt.cli import output
    from xformopt.cli.app import main

    output.set_quiet(False)
    try:
        main([str(a) for a in args])
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


def _report_dir(tmp_path: Path, report: dict | None = None, text: str | None = None) -> Path:
    directory = tmp_path / "artifact"
    directory.mkdir()
    (directory / "report.json").write_text(text if text is not None else json.dumps(report or make_report()))
    return directory


def test_report_cli_missing_dir(tmp_path, capsys):
    assert _cli(["report", tmp_path / "nope"]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and len([line for line in err.splitlines() if line.strip()]) == 1


def test_report_cli_no_report_json(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert _cli(["report", tmp_path / "empty"]) == 2
    assert "no report.json" in capsys.readouterr().err


def test_report_cli_invalid_json(tmp_path, capsys):
    assert _cli(["report", _report_dir(tmp_path, text="{not json")]) == 2
    assert "not valid JSON" in capsys.readouterr().err


def test_report_cli_bad_schema(tmp_path, capsys):
    report = make_report()
    report["schema"] = "xformopt.report/99"
    assert _cli(["report", _report_dir(tmp_path, report)]) == 2
    assert "xformopt.report/99" in capsys.readouterr().err


def test_report_cli_renders_and_rewrites(tmp_path, capsys):
    report = make_report(fixed=True, throughput=True)
    directory = _report_dir(tmp_path, report)
    before = (directory / "report.json").read_text()
    assert _cli(["report", directory]) == 0
    out, err = capsys.readouterr()
    assert all(name in out for name in STAGES)
    assert "report.md" in err
    assert (directory / "report.md").is_file()
    assert (directory / "accuracy_latency.png").read_bytes()[:8] == PNG_MAGIC
    assert (directory / "latency_seq.png").read_bytes()[:8] == PNG_MAGIC
    assert (directory / "report.json").read_text() == before  # the JSON is never rewritten

    assert _cli(["report", directory, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == report

    assert _cli(["report", directory, "--markdown"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("### xformopt:") and "](accuracy_latency.png)" in out


def test_report_cli_json_and_markdown_exclusive(tmp_path, capsys):
    assert _cli(["report", _report_dir(tmp_path), "--json", "--markdown"]) == 2


def test_report_cli_help_has_example(capsys):
    assert _cli(["report", "--help"]) == 0
    assert "Example" in capsys.readouterr().out


def test_make_report_is_not_mutated_by_rendering(tmp_path):
    report = make_report(fixed=True, throughput=True)
    snapshot = copy.deepcopy(report)
    markdown(report)
    render_text(report, 80)
    plots.write_plots(report, tmp_path)
    assert report == snapshot
