"""Reading a user's table (CSV/TSV, JSON lines or array, a ``datasets`` directory) into columns, for
:mod:`xformopt.data` (and the task loaders that read their own columns); every problem is an
``InputError`` whose one line names the file, the row and the fix. ``datasets`` is imported only
here, so it stays an optional dependency."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xformopt.errors import InputError

SUPPORTED_FORMATS = ".csv, .tsv, .jsonl, .json (JSON lines), or a datasets save_to_disk directory"
SPLIT_ORDER = ("test", "validation", "train")
DATASETS_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")


@dataclass
class _Table:
    """Rows read from any format, column by column, with a way to name a row in messages."""

    name: str                                  # path (plus ::split) for messages
    columns: list[str]
    n_rows: int
    fetch: Callable[[str], list[Any]]          # column -> one value per row (None when absent)
    where: Callable[[int], str]                # row index -> "line 7" / "row index 6"
    class_names: dict[str, list[str]] = field(default_factory=dict)  # datasets ClassLabel names
    note: str = ""                             # e.g. which split was picked


def _read_table(path: str | Path) -> _Table:
    file, split = _parse_path(path)
    if not file.exists():
        raise InputError(f"data file not found: {file}")
    if file.is_dir():
        if not any((file / m).is_file() for m in DATASETS_MARKERS):
            raise InputError(f"{file} is a directory but not a datasets save_to_disk directory (no "
                             f"{'/'.join(DATASETS_MARKERS)}); pass a file: {SUPPORTED_FORMATS}")
        return _read_datasets_dir(file, split)
    if not file.is_file():  # a FIFO or a device would block or never end
        raise InputError(f"{file} is not a regular file; pass a data file or a datasets directory")
    if split is not None:
        raise InputError(f"'::{split}' picks a split of a datasets directory, but {file} is a file; "
                         "drop the '::' suffix")
    suffix = file.suffix.lower()
    if suffix in (".csv", ".tsv"):
        return _read_delimited(file, "\t" if suffix == ".tsv" else ",")
    if suffix in (".jsonl", ".json"):
        return _read_json(file)
    raise InputError(f"unsupported data format {suffix or '(no extension)'!r} for {file}; "
                     f"supported: {SUPPORTED_FORMATS}")


def _parse_path(path: str | Path) -> tuple[Path, str | None]:
    """Split ``DIR::SPLIT``; a real file whose name contains '::' wins."""
    text = str(path)
    if "::" in text and not Path(text).exists():
        base, split = text.rsplit("::", 1)
        return Path(base), split
    return Path(text), None


@contextmanager
def _open_text(path: Path) -> Iterator[Any]:
    """Open as UTF-8 (tolerating a BOM, as Excel writes one) and turn I/O problems into InputError."""
    try:
        with open(path, encoding="utf-8-sig", newline="") as handle:
            yield handle
    except UnicodeDecodeError as e:
        raise InputError(f"{path} is not UTF-8 text (bad byte at offset {e.start}); re-save it as UTF-8") from None
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror}; check the path and its permissions") from None


@contextmanager
def _csv_field_limit(limit: int = 2**31 - 1) -> Iterator[None]:
    """Allow long documents (the csv default caps a field at 128 KiB); restore the global after."""
    old = csv.field_size_limit(limit)
    try:
        yield
    finally:
        csv.field_size_limit(old)


def _read_delimited(path: Path, delimiter: str) -> _Table:
    tsv = delimiter == "\t"
    header: list[str] | None = None
    records: list[list[str]] = []
    lines: list[int] = []
    with _open_text(path) as handle, _csv_field_limit():
        reader = csv.reader(handle, delimiter=delimiter,
                            quoting=csv.QUOTE_NONE if tsv else csv.QUOTE_MINIMAL, strict=not tsv)
        previous = 0
        try:
            for record in reader:
                start, previous = previous + 1, reader.line_num  # a quoted field may span lines
                if not record:
                    continue  # blank line
                if header is None:
                    header = _check_header(path, record)
                    continue
                if len(record) != len(header):
                    hint = "remove tab characters inside fields" if tsv else "quote fields that contain commas"
                    raise InputError(f"{path} line {start}: {len(record)} fields but the header has "
                                     f"{len(header)}; {hint}")
                records.append(record)
                lines.append(start)
        except csv.Error as e:
            raise InputError(f"{path} line {reader.line_num}: malformed {'TSV' if tsv else 'CSV'} ({e}); "
                             "fix the quoting on that line") from None
    columns = header or []
    index = {name: i for i, name in enumerate(columns)}
    return _Table(name=str(path), columns=columns, n_rows=len(records),
                  fetch=lambda col: [r[index[col]] for r in records],
                  where=lambda i: f"line {lines[i]}")


def _check_header(path: Path, header: list[str]) -> list[str]:
    seen: set[str] = set()
    for name in header:
        if name in seen:  # csv would silently keep only one of them
            raise InputError(f"{path}: column {name!r} appears twice in the header; rename one of them")
        seen.add(name)
    return header


def _read_json(path: Path) -> _Table:
    with _open_text(path) as handle:
        content = handle.read()
    if content.lstrip().startswith("["):
        rows, where = _parse_json_array(path, content)
    else:
        rows, where = _parse_json_lines(path, content)
    columns = list(dict.fromkeys(key for row in rows for key in row))  # first-seen order
    return _Table(name=str(path), columns=columns, n_rows=len(rows),
                  fetch=lambda col: [row.get(col) for row in rows], where=where)


def _parse_json_lines(path: Path, content: str) -> tuple[list[dict], Callable[[int], str]]:
    rows: list[dict] = []
    lines: list[int] = []
    # split on "\n" only: str.splitlines would also cut at U+2028, which JSON allows inside strings
    for number, line in enumerate(content.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{path} line {number}: not valid JSON ({e.msg} at column {e.colno}); "
                             "each line must be one JSON object") from None
        except (RecursionError, ValueError) as e:  # nested thousands deep, or an int of 4300+ digits
            raise InputError(f"{path} line {number}: JSON too deeply nested or a number too long "
                             f"({type(e).__name__}); each line must be one flat JSON object") from None
        if not isinstance(row, dict):
            raise InputError(f"{path} line {number}: a JSON {type(row).__name__}, not an object; "
                             'write each example as {"text": ..., "label": ...}')
        rows.append(row)
        lines.append(number)
    return rows, lambda i: f"line {lines[i]}"


def _parse_json_array(path: Path, content: str) -> tuple[list[dict], Callable[[int], str]]:
    try:
        rows = json.loads(content)
    except json.JSONDecodeError as e:
        raise InputError(f"{path} line {e.lineno}: not valid JSON ({e.msg} at column {e.colno}); "
                         "fix the file or write one JSON object per line") from None
    except (RecursionError, ValueError) as e:
        raise InputError(f"{path}: JSON too deeply nested or a number too long ({type(e).__name__}); "
                         "write one flat JSON object per line") from None
    if not isinstance(rows, list):
        raise InputError(f"{path}: expected a JSON array of objects; write one JSON object per line")
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise InputError(f"{path} item {i}: a JSON {type(row).__name__}, not an object; "
                             'write each example as {"text": ..., "label": ...}')
    return rows, lambda i: f"item {i}"


def _read_datasets_dir(directory: Path, split: str | None) -> _Table:
    try:
        import datasets  # optional dependency: only needed for save_to_disk directories
    except ImportError:
        raise InputError(f"{directory} is a Hugging Face datasets directory but the 'datasets' library is "
                         "not installed; pip install datasets (or export the data to .jsonl/.csv)") from None
    try:
        loaded = datasets.load_from_disk(str(directory))
    except Exception as e:  # corrupt, partial or written by an incompatible datasets version
        reason = " ".join(str(e).split()) or type(e).__name__
        raise InputError(f"cannot read datasets directory {directory} ({reason}); "
                         "re-save it with save_to_disk or export it to .jsonl") from None
    if isinstance(loaded, datasets.DatasetDict):
        chosen, note = _choose_split(directory, list(loaded.keys()), split)
        dataset, name = loaded[chosen], f"{directory}::{chosen}"
    else:
        if split is not None:
            raise InputError(f"{directory} holds a single dataset, not a DatasetDict with splits; "
                             f"drop '::{split}'")
        dataset, name, note = loaded, str(directory), ""
    class_names = {col: list(names) for col, feat in dataset.features.items()
                   if (names := _class_label_names(feat, datasets.ClassLabel)) is not None}
    return _Table(name=name, columns=list(dataset.column_names), n_rows=len(dataset),
                  fetch=lambda col: list(dataset[col]), where=lambda i: f"row index {i}",
                  class_names=class_names, note=note)


def _class_label_names(feature, class_label) -> list[str] | None:
    """A ClassLabel's names, also for a sequence of ClassLabels (per-token tags such as ner_tags)."""
    if isinstance(feature, class_label):
        return list(feature.names)
    inner = getattr(feature, "feature", None)  # datasets.Sequence / List of ClassLabel
    return list(inner.names) if isinstance(inner, class_label) else None


def _choose_split(directory: Path, splits: list[str], wanted: str | None) -> tuple[str, str]:
    if wanted is not None:
        if wanted not in splits:
            raise InputError(f"{directory} has no split {wanted!r} (splits: {_listing(splits)}); "
                             f"pass {directory}::SPLIT with one of these")
        return wanted, ""
    for name in SPLIT_ORDER:
        if name in splits:
            return name, f"split {name!r} picked from {_listing(splits)}; pass PATH::SPLIT for another"
    if len(splits) == 1:
        return splits[0], f"only split {splits[0]!r}"
    raise InputError(f"{directory} has no test/validation/train split (splits: {_listing(splits)}); "
                     f"pass {directory}::SPLIT to pick one")


def _listing(items: Sequence[str], limit: int = 20) -> str:
    """Comma-separated, cut short so a wide file still gives a one-line message."""
    shown = ", ".join(str(x) for x in items[:limit])
    more = len(items) - limit
    return f"{shown}, ... (+{more} more)" if more > 0 else (shown or "none")


def _cap(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."

