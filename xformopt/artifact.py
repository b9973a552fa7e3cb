"""The artifact directory: written in a temporary sibling, renamed into place only when complete.

An existing output is never replaced without ``force``; a failed run leaves nothing behind.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from xformopt.atomic import temp_sibling, write_json  # noqa: F401 - write_json re-exported for pipeline/cache
from xformopt.errors import InputError
from xformopt.locks import claim_output
from xformopt.stale import sweep

MANIFEST_SCHEMA = "xformopt.manifest/1"


def _nearest_existing(path: Path) -> Path:
    for parent in (path, *path.parents):
        if parent.exists() or parent.is_symlink():
            return parent
    return Path(path.anchor or ".")


def _overlaps(a: Path, b: Path) -> bool:
    return a == b or a in b.parents or b in a.parents


def check_output(out: Path, force: bool, protected: tuple = ()) -> None:
    """Fail before any work when ``out`` cannot safely become the output folder.

    Refused: an existing output without --force; a file even with --force; a symbolic link (replacing
    it would swap the link, not its target: name the real path); a path under a file or an unwritable
    folder; and a path equal to, inside, or holding any ``protected`` path (the input model, the data
    files, the cache), which --force would otherwise delete.
    """
    out = Path(out)
    if out.is_symlink():
        target = os.readlink(out)
        state = "" if out.exists() else " (dangling)"
        raise InputError(f"output {out} is a symbolic link to {target}{state}; pass the real path as -o "
                         "or remove the link")
    if out.exists():
        if not out.is_dir():
            raise InputError(f"output {out} exists and is not a directory; remove it or choose another -o")
        if not force:
            raise InputError(f"output {out} already exists; pass --force to replace it or choose another -o")
    absolute = Path(os.path.abspath(out))
    existing = _nearest_existing(absolute.parent)
    if not existing.is_dir():
        raise InputError(f"cannot create output {out}: {existing} is a file, not a folder; choose another -o")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise InputError(f"cannot write to {existing} (permission denied); choose another -o")
    resolved = absolute.resolve()
    for item in protected:
        if item is None:
            continue
        other = Path(item).expanduser().resolve()
        if _overlaps(resolved, other):
            how = "is" if resolved == other else ("is inside" if other in resolved.parents else "contains")
            raise InputError(f"output {out} {how} {other}, which this run reads (model, data or cache); "
                             "choose an -o outside it")
    if protected and out.is_dir() and any(out.iterdir()) and not _is_earlier_output(out):
        # --force deletes what it replaces: only an earlier xformopt output (or an empty folder),
        # never a home directory, a hub cache or a project folder mistyped as -o. Checked last (and
        # only in the full check, with the inputs known) so that an overlap is named as such.
        raise InputError(f"output {out} is not an xformopt output (no xformopt manifest.json), so --force will "
                         "not replace it; choose another -o (it is left untouched)")


def _is_earlier_output(directory: Path) -> bool:
    """True when DIRECTORY holds a manifest.json that optimize or a pass command wrote."""
    try:
        manifest = json.loads((directory / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(manifest, dict) and str(manifest.get("schema", "")).startswith("xformopt.manifest/")


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux renameat2 RENAME_EXCHANGE); False where unsupported.

    By hand because os has no renameat2: it is the only way to replace a non-empty folder so that
    every observer sees the old one or the new one, never neither."""
    import ctypes

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


@contextmanager
def atomic_dir(out: Path, force: bool, *, wait: bool = False, protected: tuple = ()) -> Iterator[Path]:
    """Yield an empty temp sibling of ``out``; on success it replaces ``out``, on error it vanishes.

    The output's lock is held from before the temp folder exists until the rename, so two runs on
    one -o cannot both publish (the second is refused, or waits with ``wait``)."""
    out = Path(out)
    check_output(out, force, protected)
    out.parent.mkdir(parents=True, exist_ok=True)
    with claim_output(out, wait=wait):
        check_output(out, force, protected)  # again under the lock: another run may have just published
        sweep(out.parent)
        tmp = temp_sibling(out)
        tmp.mkdir()
        try:
            yield tmp
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if out.exists():  # --force
            if not _exchange(tmp, out):  # fallback: move aside, then in; a crash leaves a swept .old-PID
                old = temp_sibling(out, "old")
                out.rename(old)
                tmp.rename(out)
                tmp = old
            shutil.rmtree(tmp, ignore_errors=True)  # now the old output
        else:
            tmp.rename(out)


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def hash_dir(path: Path) -> str:
    """Content hash of a model directory: file names and bytes, in a stable order."""
    digest = hashlib.sha256()
    for file in sorted(p for p in Path(path).rglob("*") if p.is_file() and not p.name.startswith(".")):
        digest.update(str(file.relative_to(path)).encode())
        digest.update(sha256_file(file).encode())
    return digest.hexdigest()


# What a run writes beside the model: never carried from one stage or artifact into the next, so
# `xformopt quantize a/ -o q/` cannot pass off a's report as q's.
RUN_OUTPUTS = ("manifest.json", "report.json", "report.md", "reference", "*.png")


def is_run_output(name: str) -> bool:
    """Hidden bookkeeping or a file a run writes beside the model (report, manifest, plots)."""
    return name.startswith(".") or any(fnmatch.fnmatch(name, pattern) for pattern in RUN_OUTPUTS)


def copy_stage(stage_dir: Path, dst: Path, *, with_model: bool = True) -> None:
    """Copy a stage's model, tokenizer and config files (not the run outputs beside them) into dst."""
    for item in Path(stage_dir).iterdir():
        if is_run_output(item.name):
            continue
        if not with_model and item.name.startswith("model.onnx"):
            continue
        if item.is_dir():
            shutil.copytree(item, dst / item.name, dirs_exist_ok=True)
        else:
            shutil.copy2(item, dst / item.name)


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".h5", ".msgpack")


def copy_side_files(src: Path, dst: Path) -> None:
    """A torch stage's tokenizer and other non-weight files into dst, after save_pretrained wrote the
    weights and config there (files already in dst and run outputs are left alone)."""
    for item in Path(src).iterdir():
        if item.is_file() and not (dst / item.name).exists() and not item.name.endswith(WEIGHT_SUFFIXES) \
                and not is_run_output(item.name):
            shutil.copy2(item, dst / item.name)
    copy_sentence_transformers_modules(src, dst)


# README.md: the model card, where sentence-transformers records the Matryoshka sizes a model was trained for
SENTENCE_TRANSFORMERS_FILES = ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json",
                               "README.md")


def copy_sentence_transformers_modules(src: Path, dst: Path) -> list[str]:
    """A sentence-transformers model's module files (pooling, normalize, dense, max length), so that
    ``SentenceTransformer(artifact, backend="onnx")`` rebuilds the same pipeline around model.onnx
    instead of a default one (no Normalize, the tokenizer's 512 tokens). Returns what was copied."""
    src, dst = Path(src), Path(dst)
    if not (src / "modules.json").is_file():
        return []
    copied = []
    for name in SENTENCE_TRANSFORMERS_FILES:
        if (src / name).is_file() and not (dst / name).exists():
            shutil.copy2(src / name, dst / name)
            copied.append(name)
    try:
        modules = json.loads((src / "modules.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        raise InputError(f"{src / 'modules.json'} is not valid JSON; fix or remove it") from None
    for module in modules if isinstance(modules, list) else []:
        path = module.get("path") if isinstance(module, dict) else None
        folder = (src / path).resolve() if isinstance(path, str) and path else None
        # module folders only, inside the model directory (never follow a path out of it)
        if folder and folder.is_dir() and folder.is_relative_to(src.resolve()) and not (dst / path).exists():
            shutil.copytree(folder, dst / path)
            copied.append(path)
    return copied


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list) -> dict:
    """json's object hook: a key given twice (json.loads keeps the last) is refused, as in YAML (safe_yaml)."""
    data = {}
    for key, value in pairs:
        if key in data:
            raise _DuplicateKey(key)
        data[key] = value
    return data


def load_json(path: Path, *, missing: str, fix: str) -> dict:
    """A JSON object from ``path``; every problem is one InputError line (``missing`` when the file
    is absent, otherwise what is wrong followed by ``fix``)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(missing)
    try:
        data = json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=_unique_keys)
    except _DuplicateKey as exc:
        raise InputError(f"{path}: key {exc.args[0]!r} is given twice in one object (JSON would keep the last "
                         f"value silently); {fix}") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{path} is not valid JSON ({exc.msg}, line {exc.lineno}); {fix}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read {path} ({type(exc).__name__}); {fix}") from None
    except (RecursionError, ValueError):  # nested 100,000 deep, or an int of 4300+ digits
        raise InputError(f"{path} is not valid JSON (nested too deeply or a number too long); {fix}") from None
    if not isinstance(data, dict):
        raise InputError(f"{path} is not a JSON object; {fix}")
    return data


def read_manifest(artifact: Path) -> dict:
    return load_json(
        Path(artifact) / "manifest.json",
        missing=f"{artifact} is not an xformopt artifact (no manifest.json); pass the -o folder of `xformopt optimize`",
        fix="re-run optimize",
    )

