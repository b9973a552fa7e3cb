"""Shared pieces of the hardening tests: a quick recipe, one-line error checks, tree snapshots."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from helpers import error_lines, run_cli


def quick_recipe(tmp_path: Path, heldout_file: Path, passes: str = "- export", name: str = "quick.yaml") -> Path:
    """export only (or PASSES), 8 rows, 3 timing rounds: a full optimize in a few seconds."""
    path = tmp_path / name
    steps = "\n".join("  " + line for line in passes.splitlines())
    path.write_text(f"name: quick\ntarget: avx2\npasses:\n{steps}\nevaluation:\n  data: {heldout_file}\n"
                    "  limit: 8\n  latency_rounds: 3\n  warmup: 0\n  repeats: 1\n")
    return path


def one_error(code: int, stderr: str, *fragments: str, exit_code: int = 2) -> str:
    """Exit EXIT_CODE, exactly one non-log line on stderr, 'error: ...', containing FRAGMENTS; no traceback."""
    lines = [line for line in error_lines(stderr) if not line.startswith("xformopt:")]
    assert "Traceback" not in stderr, stderr
    assert code == exit_code, stderr
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: "), lines
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def assert_distill_refuses(student, cases, tmp_path: Path, capsys) -> None:
    """Each (extra args, fragment): `xformopt distill STUDENT` exits 2 with one error line naming FRAGMENT,
    before any training, and writes nothing."""
    for args, fragment in cases:
        out = tmp_path / "d"
        code, _, err = run_cli(["distill", student, "-o", out, "--max-steps", "2", *args], capsys)
        lines = [line for line in err.splitlines() if line.startswith("error:")]
        assert code == 2 and fragment in err, (args, err)
        assert len(lines) == 1 and not out.exists()


def tree(directory: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under DIRECTORY (to prove nothing changed)."""
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(Path(directory).rglob("*")) if p.is_file()}


def leftovers(directory: Path) -> list[str]:
    """Temp or aside folders/files of a run (.NAME.tmp-PID-NS, .NAME.old-PID, .NAME.lock)."""
    return sorted(p.name for p in Path(directory).iterdir() if re.match(r"^\..*(\.(tmp|old)-|\.lock$)", p.name))
