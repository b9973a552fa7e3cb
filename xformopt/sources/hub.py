"""Hub ids (``org/name`` or ``org/name@revision``) downloaded through huggingface_hub, like every HF
tool does: its cache (HF_HOME / HF_HUB_CACHE), HF_TOKEN, HF_ENDPOINT, its progress bars on stderr.

Offline only when the user says so (``HF_HUB_OFFLINE=1``) or the hub cannot be reached within a
short timeout (``HF_HUB_ETAG_TIMEOUT``, default 5 s here): then an id already in the cache is used,
and anything else is one line naming the id and how to pass a local path. The snapshot folder is
``.../snapshots/<commit sha>``, so the commit a run used is known from its path (``commit_of``).
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from xformopt.errors import InputError

_log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 5.0

# What a run reads: config, tokenizer, weights, sentence-transformers module files. Not the TF,
# Flax, ONNX, OpenVINO or GGUF copies many repos also carry (often several GB).
IGNORE = ["*.h5", "*.msgpack", "*.ot", "*.onnx", "*.onnx_data", "onnx/*", "openvino/*", "*.gguf", "*.tflite",
          "coreml/*", "*.mlmodel", "flax_model*", "tf_model*", "*.md", ".gitattributes"]
TORCH_BINARIES = ["*.bin", "*.pt", "*.pth", "*.ckpt"]

_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")


def parse_id(text: str) -> tuple[str, str | None]:
    """``org/name@rev`` -> (``org/name``, ``rev``); refuses what cannot be a hub id."""
    repo_id, _, revision = text.partition("@")
    if not _ID.match(repo_id) or repo_id.endswith((".", "-")) or ".." in repo_id or (_ and not revision):
        raise InputError(f"model {text!r} is not a local folder and not a hub id (org/name or org/name@revision); "
                         "pass a folder saved with save_pretrained() or a Hugging Face model id")
    return repo_id, revision or None


def commit_of(path: Path) -> str | None:
    """The commit sha of a hub snapshot folder (``.../snapshots/<sha>``), else None."""
    path = Path(path)
    if path.parent.name == "snapshots" and re.fullmatch(r"[0-9a-f]{40}", path.name):
        return path.name
    return None


def offline() -> bool:
    from huggingface_hub import constants

    env = os.environ.get("HF_HUB_OFFLINE")
    if env is not None:
        return env.strip().upper() in {"1", "ON", "YES", "TRUE"}
    return bool(constants.HF_HUB_OFFLINE)


def timeout_s() -> float:
    try:
        return float(os.environ.get("HF_HUB_ETAG_TIMEOUT") or DEFAULT_TIMEOUT_S)
    except ValueError:
        return DEFAULT_TIMEOUT_S


def _cached(repo_id: str, revision: str | None) -> Path | None:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, revision=revision, local_files_only=True))
    except (LocalEntryNotFoundError, ValueError, OSError):
        return None


def _transport_errors() -> tuple[type[BaseException], ...]:
    """The HTTP client's own errors (no connection, a malformed HF_ENDPOINT): huggingface_hub 1.x+ talks
    through httpx (its ``httpx2`` build in 2.x), older releases through requests."""
    errors: list[type[BaseException]] = []
    for module, names in (("httpx2", ("HTTPError", "InvalidURL", "UnsupportedProtocol")),
                          ("httpx", ("HTTPError", "InvalidURL", "UnsupportedProtocol")),
                          ("requests.exceptions", ("RequestException",))):
        try:
            imported = __import__(module, fromlist=list(names))
        except ImportError:
            continue
        errors += [getattr(imported, name) for name in names if hasattr(imported, name)]
    return tuple(errors)


def _local_hint(repo_id: str) -> str:
    return (f"or download it where the hub is reachable (`hf download {repo_id} --local-dir DIR`) and pass its "
            "local path (any folder saved with save_pretrained())")


def fetch(model: str, repo_id: str, revision: str | None, hint: str = "") -> Path:
    """The local snapshot folder of ``repo_id`` at ``revision`` (default: main), downloading what is
    missing; every failure is one InputError line."""
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    at = f" at revision {revision}" if revision else ""
    named = f"model {model!r}" + (f" ({repo_id}{at})" if model != f"{repo_id}{'@' + revision if revision else ''}" else "")
    if offline():
        if (cached := _cached(repo_id, revision)) is not None:
            return cached
        raise InputError(f"{named} is not a local folder nor in the Hugging Face cache, and HF_HUB_OFFLINE=1 "
                         f"forbids downloading it: unset HF_HUB_OFFLINE, {_local_hint(repo_id)}{hint}")
    endpoint = os.environ.get("HF_ENDPOINT") or None
    api = HfApi(endpoint=endpoint)
    where = endpoint or "https://huggingface.co"
    try:
        # Our own short-timeout look-up first: snapshot_download's has none, and a black-holed
        # network would hang it for minutes.
        info = api.model_info(repo_id, revision=revision, timeout=timeout_s())
    except RevisionNotFoundError:
        raise InputError(f"model {repo_id} has no revision {revision!r} on {where}; pass a branch, tag or "
                         "commit that exists (org/name@main)") from None
    except GatedRepoError:
        raise InputError(f"model {repo_id} is gated on {where}: accept its terms on the model page and set "
                         "HF_TOKEN to a token of that account") from None
    except RepositoryNotFoundError:
        raise InputError(f"model {model!r}: no repository {repo_id} on {where} (or it is private: set HF_TOKEN); "
                         "check the id or pass a local folder") from None
    except (*_transport_errors(), OfflineModeIsEnabled, HfHubHTTPError) as exc:  # incl. a malformed HF_ENDPOINT
        if (cached := _cached(repo_id, revision)) is not None:
            _log.info(f"hub {where} not reachable ({type(exc).__name__}); using the cached {repo_id}")
            return cached
        status = getattr(getattr(exc, "response", None), "status_code", None)
        reason = f"HTTP {status}" if status else type(exc).__name__
        raise InputError(f"cannot download {named}: the hub {where} is not reachable ({reason}, "
                         f"{timeout_s():g} s timeout) and it is not in the cache; check the network or HF_ENDPOINT, "
                         f"{_local_hint(repo_id)}{hint}") from None
    sha = info.sha
    files = [s.rfilename for s in (info.siblings or [])]
    ignore = list(IGNORE)
    if any(f.endswith(".safetensors") for f in files):
        ignore += TORCH_BINARIES  # safetensors preferred: never download (or unpickle) a second copy
    _log.info(f"downloading {repo_id}@{(sha or revision or 'main')[:12]} from {where} (cache: huggingface_hub's)")
    try:
        # The revision as given (not the sha), so the cache also records the branch/tag -> commit ref
        # that a later offline run looks up.
        path = snapshot_download(repo_id, revision=revision or "main", endpoint=endpoint, ignore_patterns=ignore,
                                 etag_timeout=timeout_s())
    except (*_transport_errors(), HfHubHTTPError, OfflineModeIsEnabled) as exc:
        raise InputError(f"download of {repo_id}{at} from {where} failed ({type(exc).__name__}); "
                         f"try again, {_local_hint(repo_id)}") from None
    return Path(path)
