"""The embedding sizes a model was trained to be cut to (Matryoshka representation learning), where its
files say: ``matryoshka_dimensions`` / ``matryoshka_dims`` in config.json or
config_sentence_transformers.json, else the ``matryoshka_dims`` list sentence-transformers writes into
the model card (README.md) when a MatryoshkaLoss trained it. Nothing declared: None (any ``dimensions``
still cuts the vector; it is just not a size the model was trained for)."""

from __future__ import annotations

import json
import re
from pathlib import Path

KEYS = ("matryoshka_dimensions", "matryoshka_dims")
_CARD = re.compile(r"""["']?matryoshka_dims["']?\s*[:=]\s*\[([\d,\s]+)\]""")


def declared_dimensions(model_dir: str | Path, width: int) -> list[int] | None:
    """The declared sizes, largest first, each in 1..``width``; None when no file declares any."""
    model_dir = Path(model_dir)
    for name in ("config.json", "config_sentence_transformers.json"):
        config = _json(model_dir / name)
        for key in KEYS:
            if isinstance(config.get(key), list):
                return _sizes(config[key], width)
    try:
        card = (model_dir / "README.md").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    found = _CARD.search(card)
    return _sizes([int(v) for v in found.group(1).split(",") if v.strip()], width) if found else None


def _sizes(values: list, width: int) -> list[int] | None:
    sizes = sorted({v for v in values if type(v) is int and 0 < v <= width}, reverse=True)
    return sizes or None


def _json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
