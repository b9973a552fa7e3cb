"""The artifact directory: written in a temporary sibling, renamed into place only when complete.

An existing output is never replaced without ``force``; a failed run leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from xformopt.errors import InputError

MANIFEST_SCHEMA = "xformopt.manifest/1"


def check_output(out: Path, force: bool) -> None:
    """Fail before any work when the output exists (and --force was not given) or cannot be made."""
    out = Path(out)
    if out.exists() and not force:
        raise InputError(f"output {out} already exists; pass --force to replace it or choose another -o")
    if out.exists() and not out.is_dir():
        raise InputError(f"output {out} exists and is not a directory; remove it or choose another -o")
    parent = out.resolve().parent
    if parent.exists() and not os.access(parent, os.W_OK):
        raise InputError(f"cannot write to {parent}; choose another -o")


@contextmanager
def atomic_dir(out: Path, force: bool) -> Iterator[Path]:
    """Yield an empty temp sibling of ``out``; on success it replaces ``out``, on error it vanishes."""
    out = Path(out)
    check_output(out, force)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{time.monotonic_ns()}"
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out.exists():  # --force: move the old one aside first so a crash never leaves neither
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old, ignore_errors=True)
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
    import fnmatch

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


SENTENCE_TRANSFORMERS_FILES = ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json")


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


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def load_json(path: Path, *, missing: str, fix: str) -> dict:
    """A JSON object from ``path``; every problem is one InputError line (``missing`` when the file
    is absent, otherwise what is wrong followed by ``fix``)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(missing)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise InputError(f"{path} is not valid JSON ({exc.msg}, line {exc.lineno}); {fix}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read {path} ({type(exc).__name__}); {fix}") from None
    if not isinstance(data, dict):
        raise InputError(f"{path} is not a JSON object; {fix}")
    return data


def read_manifest(artifact: Path) -> dict:
    return load_json(
        Path(artifact) / "manifest.json",
        missing=f"{artifact} is not an xformopt artifact (no manifest.json); pass the -o folder of `xformopt optimize`",
        fix="re-run optimize",
    )


def write_text_atomic(path: Path, text: str) -> None:
    """Write to a temp file next to ``path``, then rename it into place (never a half-written file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}-{time.monotonic_ns()}"
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
