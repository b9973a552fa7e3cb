"""`xformopt cache list|verify|prune|clear`: the finished-pass cache and the stores beside it
(:mod:`xformopt.cache_stores`: teacher outputs, importance scores, distillation checkpoints), with sizes.

Entries in use by a running `optimize` (they hold a shared lock) are never removed; they are
listed as skipped. The stores are kept whole while any run holds them.
"""

from __future__ import annotations

import re

import typer
from rich.table import Table

from xformopt import cache, cache_stores
from xformopt.cli import options as opt
from xformopt.cli import output
from xformopt.errors import GateFailed, InputError

app = typer.Typer(
    help="Inspect, verify and trim the pass cache (XFORMOPT_CACHE_DIR, default ~/.cache/xformopt).\n\n"
    "Example: xformopt cache prune --older-than 30d --max-size 5GB",
    no_args_is_help=True,
)

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
          "t": 1000**4, "tb": 1000**4, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_size(text: str, flag: str = "--max-size") -> int:
    """``500MB``, ``5G``, ``1.5GiB``, ``0`` -> bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text or "")
    unit = match.group(2).lower() if match else None
    if not match or unit not in _UNITS:
        raise InputError(f"{flag}: {text!r} is not a size; write e.g. 500MB, 5GB or 2GiB")
    return int(float(match.group(1)) * _UNITS[unit])


def parse_duration(text: str, flag: str = "--older-than") -> float:
    """``30d``, ``12h``, ``90m``, ``2w``, ``45s`` -> seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", (text or "").lower())
    if not match:
        raise InputError(f"{flag}: {text!r} is not a duration; write e.g. 30d, 12h, 90m, 2w or 45s")
    return float(match.group(1)) * _SECONDS[match.group(2)]


def human_size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"  # pragma: no cover


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def _stores_table(rows: list[dict]) -> Table:
    table = Table("Store", "Holds", "Items", "Size", "Newest", "Status", title="beside the entries")
    for row in rows:
        count = row.get("removed", row.get("items"))
        size = row.get("freed_bytes", row.get("size_bytes"))
        age = row.get("age_s")
        table.add_row(row["store"], row["holds"], str(count), human_size(size), "-" if age is None else f"{_age(age)} ago",
                      row.get("action") or "")
    return table


def _trim_stores(max_age_s: float | None, dry_run: bool) -> list[dict]:
    rows, busy = cache_stores.trim(max_age_s, dry_run)
    for row in rows:
        if busy:
            row["action"] = "in use by a running command: kept"
        elif row["linked"]:
            row["action"] = "a symbolic link: kept (trim the folder it points to yourself)"
        else:
            row["action"] = ("would remove" if dry_run else "removed") if row["removed"] else "nothing to remove"
    if busy:
        output.log("the cache's stores are in use by a running command: kept (run it again when no run is going)")
    return rows


def _table(rows: list[dict], title: str) -> Table:
    table = Table("Key", "Pass", "Size", "Last used", "Status", title=title)
    for row in rows:
        status = "ok" if row["ok"] else f"corrupt: {row['problem']}"
        table.add_row(row["key"], row["pass"] or "?", human_size(row["size_bytes"]), f"{_age(row['age_s'])} ago",
                      row.get("action") or status)
    return table


@app.command("list")
def list_entries(as_json: opt.Json = False, quiet: opt.Quiet = False) -> None:
    """List cache entries with their pass, size and last use (sizes and file lists checked; use
    `verify` to re-hash every file).

    Example: xformopt cache list --json | jq '[.entries[].size_bytes] | add'
    """
    rows = [cache.describe(e, deep=False) for e in cache.entries()]
    stores = cache_stores.describe()
    doc = {"root": str(cache.cache_root()), "entries": rows, "total_bytes": sum(r["size_bytes"] for r in rows),
           "stores": stores, "stores_bytes": sum(r["size_bytes"] for r in stores)}
    if as_json:
        output.emit_json(doc)
        return
    output.stdout.print(_table(rows, f"{cache.cache_root()}: {len(rows)} entries, {human_size(doc['total_bytes'])}"))
    output.stdout.print(_stores_table(stores))


@app.command("verify")
def verify(as_json: opt.Json = False, quiet: opt.Quiet = False) -> None:
    """Re-hash every file of every entry; corrupt entries are evicted (they would be recomputed on
    the next run anyway). Exit 1 when one was found.

    Example: xformopt cache verify
    """
    rows = []
    for entry in cache.entries():
        row = cache.describe(entry, deep=True)
        if not row["ok"]:
            row["action"] = "evicted" if cache.remove_if_unused(entry) else "corrupt, in use: kept"
            output.log(f"cache entry {row['key']} is corrupt ({row['problem']}): {row['action']}")
        rows.append(row)
    bad = [r for r in rows if not r["ok"]]
    doc = {"root": str(cache.cache_root()), "entries": rows, "corrupt": len(bad)}
    if as_json:
        output.emit_json(doc)
    else:
        output.stdout.print(_table(rows, f"{cache.cache_root()}: {len(rows)} entries, {len(bad)} corrupt"))
    if bad:
        raise GateFailed(f"{len(bad)} corrupt cache entr{'y' if len(bad) == 1 else 'ies'} found and evicted "
                         "(they are recomputed on the next run)")


def _remove(rows: list[dict], entries_by_key: dict, dry_run: bool) -> None:
    for row in rows:
        if dry_run:
            row["action"] = "would remove"
        else:
            row["action"] = "removed" if cache.remove_if_unused(entries_by_key[row["key"]]) else "in use: kept"


def _report(rows: list[dict], stores: list[dict], as_json: bool, verb: str) -> None:
    """``removed`` counts entries; ``freed_bytes`` is the entries' and the stores' bytes together."""
    removed = [r for r in rows if r.get("action") in ("removed", "would remove")]
    store_bytes = sum(r["freed_bytes"] for r in stores if r["action"] in ("removed", "would remove"))
    freed = sum(r["size_bytes"] for r in removed) + store_bytes
    doc = {"root": str(cache.cache_root()), "entries": rows, "removed": len(removed), "freed_bytes": freed,
           "stores": stores}
    if as_json:
        output.emit_json(doc)
        return
    if rows:
        output.stdout.print(_table(rows, f"{cache.cache_root()}"))
    if any(r["removed"] for r in stores):
        output.stdout.print(_stores_table(stores))
    items = sum(r["removed"] for r in stores if r["action"] in ("removed", "would remove"))
    output.stdout.print(f"{verb} {len(removed)} entr{'y' if len(removed) == 1 else 'ies'} and {items} stored "
                        f"item{'' if items == 1 else 's'}, {human_size(freed)}", highlight=False)


@app.command("prune")
def prune(
    older_than: str = typer.Option(None, "--older-than", metavar="DURATION", help="Remove entries not used for this long (30d, 12h, 90m, 2w)."),
    max_size: str = typer.Option(None, "--max-size", metavar="SIZE", help="Then remove least recently used entries until the cache fits (500MB, 5GB)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Only list what would be removed."),
    as_json: opt.Json = False,
    quiet: opt.Quiet = False,
) -> None:
    """Remove old entries (and stored teacher outputs, scores and checkpoints not used for as long), then
    least recently used entries beyond a size; what a running command uses is kept.

    Example: xformopt cache prune --older-than 30d --max-size 5GB
    """
    if older_than is None and max_size is None:
        raise InputError("cache prune needs --older-than DURATION and/or --max-size SIZE "
                         "(e.g. --older-than 30d); `xformopt cache clear` removes everything")
    max_age = parse_duration(older_than) if older_than is not None else None
    limit = parse_size(max_size) if max_size is not None else None
    by_key = {e.name: e for e in cache.entries()}
    rows = sorted((cache.describe(e, deep=False) for e in by_key.values()), key=lambda r: -r["age_s"])  # oldest first
    chosen = [r for r in rows if max_age is not None and r["age_s"] > max_age]
    if limit is not None:
        total = sum(r["size_bytes"] for r in rows if r not in chosen)
        for row in rows:
            if total <= limit:
                break
            if row not in chosen:
                chosen.append(row)
                total -= row["size_bytes"]
    _remove(chosen, by_key, dry_run)
    stores = _trim_stores(max_age, dry_run) if max_age is not None else []
    _report(chosen, stores, as_json, "would remove" if dry_run else "removed")


@app.command("clear")
def clear(as_json: opt.Json = False, quiet: opt.Quiet = False) -> None:
    """Remove every entry, and everything in the stores beside them, not in use by a running command.

    Example: xformopt cache clear
    """
    by_key = {e.name: e for e in cache.entries()}
    rows = [cache.describe(e, deep=False) for e in by_key.values()]
    _remove(rows, by_key, False)
    _report(rows, _trim_stores(None, False), as_json, "removed")
