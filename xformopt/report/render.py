"""Write a report's files: report.json first (never lost), then report.md and the PNG plots.

Everything derives from the report document alone (schema ``xformopt.report/1``, see
docs/report-schema.md), so ``xformopt report DIR`` can re-render at any later time. The views live
beside this module: ``console`` (rich), ``markdown`` and ``plots``; ``cells`` formats their figures.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from xformopt.atomic import write_text
from xformopt.report import plots
from xformopt.report.markdown import markdown
from xformopt.report.types import Report

_log = logging.getLogger(__name__)


def write_derived_files(report: Report, directory: Path) -> list[Path]:
    """report.md and the PNG plots, from the report alone; returns the files written.

    report.md is written first, without images; the plots follow, and report.md is rewritten with
    links to the plots that were made. A plot failure is reported (``log`` or a warning) and never
    loses report.md."""
    directory = Path(directory)
    md_path = directory / "report.md"
    write_text(md_path, markdown(report))
    written = [md_path]
    def failed(name: str, exc: Exception) -> None:
        _log.warning(f"{name} not written: {type(exc).__name__}: {exc}")

    try:
        images = plots.write_plots(report, directory, on_error=failed)
    except Exception as exc:  # noqa: BLE001 - matplotlib missing or broken, a full disk, ...
        _log.warning(f"plots not written: {type(exc).__name__}: {exc}")
        images = []
    # Stale plots from an earlier run must not be linked: only what was written now is embedded.
    if images:
        write_text(md_path, markdown(report, images=[p.name for p in images]))
    return written + images


def write_report_files(report: Report, directory: Path) -> list[Path]:
    """report.json, report.md and the plots into ``directory``; JSON first, so a failure later on
    never loses it. Returns the files written."""
    directory = Path(directory)
    json_path = directory / "report.json"
    write_text(json_path, json.dumps(report, indent=2) + "\n")
    return [json_path, *write_derived_files(report, directory)]
