"""Nothing leaves the machine: the telemetry switches of the libraries xformopt loads, set once at start.

xformopt sends nothing itself. Some libraries it loads would, unless told not to:

- ONNX Runtime 1.29+ (the Linux and macOS wheels) starts a telemetry uploader (Microsoft's 1DS SDK, to
  ``mobile.events.data.microsoft.com``) when its native module loads, i.e. at ``import onnxruntime``. It
  reads ``ORT_DISABLE_TELEMETRY`` then, once, and latches the answer; set afterwards the variable does
  nothing, and ``onnxruntime.disable_telemetry_events()`` leaves the uploader running (measured:
  docs/privacy.md). onnxruntime-genai reads the same variable.
- huggingface_hub (under transformers and datasets) reads ``HF_HUB_DISABLE_TELEMETRY`` when it is
  imported: its request headers then carry no library details, and its ``send_telemetry`` does nothing.
- Ray reports usage statistics from a cluster that this process starts, unless ``RAY_USAGE_STATS_ENABLED=0``.

So the switches are set in ``os.environ`` by the package root (xformopt/__init__.py), which Python runs
before any module of the package, and so before any of them imports one of those libraries; processes
xformopt starts (serve under loadtest, search workers, a local Ray cluster) inherit them. A value the
user set is kept when it already means "off" as the library reads it, and replaced (with one warning
line) when it would send data.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Mapping, MutableMapping
from typing import NamedTuple

_log = logging.getLogger(__name__)


class Switch(NamedTuple):
    name: str
    value: str  # what xformopt sets
    is_off: Callable[[str], bool]  # whether a value already turns it off, read as the library reads it
    library: str


def _ort_off(value: str) -> bool:
    # onnxruntime/core/platform/telemetry_environment.h, IsTelemetryDisabledByEnvironment: trimmed, lowered.
    return value.strip().lower() in {"1", "true", "yes", "on", "y"}


SWITCHES = (
    Switch("ORT_DISABLE_TELEMETRY", "1", _ort_off, "ONNX Runtime"),
    # The name ONNX Runtime's sources used for a while (microsoft/onnxruntime#29843); no release 1.29-1.32
    # reads it, set too in case a later one does again.
    Switch("ORT_TELEMETRY_DISABLED", "1", _ort_off, "ONNX Runtime"),
    # huggingface_hub/constants.py, _is_true: upper-cased, not trimmed.
    Switch("HF_HUB_DISABLE_TELEMETRY", "1", lambda v: v.upper() in {"1", "ON", "YES", "TRUE"}, "huggingface_hub"),
    # ray/_common/usage/usage_lib.py: exactly "0" disables; anything but "0" or "1" is an error there.
    Switch("RAY_USAGE_STATS_ENABLED", "0", lambda v: v == "0", "Ray"),
)


def switch_off(environ: MutableMapping[str, str] | None = None, modules: Mapping[str, object] | None = None) -> list[str]:
    """Set every telemetry switch to off in ``environ`` (``os.environ``); returns the names whose value
    was replaced. ``modules``: what is imported already (``sys.modules``)."""
    environ = os.environ if environ is None else environ
    modules = sys.modules if modules is None else modules
    replaced = []
    for switch in SWITCHES:
        given = environ.get(switch.name)
        if given is not None and switch.is_off(given):
            continue
        if given:  # an explicit value that would send data: xformopt's promise wins, and says so
            _log.warning("%s=%s would let %s send telemetry: xformopt sets %s=%s (xformopt sends nothing; "
                        "docs/privacy.md)", switch.name, given, switch.library, switch.name, switch.value)
            replaced.append(switch.name)
        environ[switch.name] = switch.value
        if switch.name == "ORT_DISABLE_TELEMETRY" and _uploads(modules.get("onnxruntime")):
            # Only a caller of the Python API can get here (the CLI imports xformopt first): too late to help.
            _log.warning("onnxruntime was imported before xformopt, without ORT_DISABLE_TELEMETRY=1: its telemetry "
                        "uploader is already running in this process. Import xformopt first, or set "
                        "ORT_DISABLE_TELEMETRY=1 before Python starts (docs/privacy.md)")
    return replaced


def _uploads(onnxruntime) -> bool:
    """Whether an ONNX Runtime already loaded has the uploader running (1.29 added it)."""
    if onnxruntime is None:
        return False
    try:
        return tuple(int(part) for part in str(onnxruntime.__version__).split(".")[:2]) >= (1, 29)
    except (AttributeError, ValueError):
        return True  # unknown: say so rather than stay silent
