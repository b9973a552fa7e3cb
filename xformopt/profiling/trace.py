"""Read ONNX Runtime's profiler output (a Chrome trace-event JSON list) into runs of kernel calls.

Each ``InferenceSession.run`` is one ``model_run`` event (category Session); every kernel call is a
``<node>_kernel_time`` event (category Node) whose ``args`` carry the op type and the input and output
shapes. Kernel calls are assigned to the run whose time span holds them.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field
from pathlib import Path

from xformopt.errors import InputError

KERNEL_SUFFIX = "_kernel_time"


@dataclass(frozen=True)
class Kernel:
    node: str
    op_type: str
    dur_us: float
    input_shapes: list[list[int]]
    input_dtypes: list[str]
    output_shapes: list[list[int]]


@dataclass
class Run:
    ts_us: float
    dur_us: float
    kernels: list[Kernel] = field(default_factory=list)

    @property
    def kernel_us(self) -> float:
        return sum(k.dur_us for k in self.kernels)


def _shapes(items) -> tuple[list[list[int]], list[str]]:
    shapes, dtypes = [], []
    for item in items or []:
        if isinstance(item, dict) and len(item) == 1:
            (dtype, shape), = item.items()
            shapes.append([int(d) for d in shape] if isinstance(shape, list) else [])
            dtypes.append(str(dtype))
    return shapes, dtypes


def load_events(path: Path) -> list[dict]:
    try:
        events = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"cannot read the profiler trace {path} ({exc}); it must be ONNX Runtime's JSON trace") from None
    if not isinstance(events, list):
        raise InputError(f"{path} is not a trace-event list (ONNX Runtime's profiler output)")
    return [e for e in events if isinstance(e, dict)]


def runs(events: list[dict]) -> list[Run]:
    """The session's runs in time order, each with the kernel calls inside its span."""
    found = sorted((Run(float(e["ts"]), float(e["dur"])) for e in events
                    if e.get("cat") == "Session" and e.get("name") == "model_run"), key=lambda r: r.ts_us)
    starts = [r.ts_us for r in found]
    for e in events:
        name = str(e.get("name", ""))
        if e.get("cat") != "Node" or not name.endswith(KERNEL_SUFFIX):
            continue
        ts = float(e["ts"])
        i = bisect.bisect_right(starts, ts) - 1
        if i < 0 or ts > found[i].ts_us + found[i].dur_us:
            continue  # outside every run (cannot happen for a sequential executor; never guessed)
        args = e.get("args") or {}
        inputs, dtypes = _shapes(args.get("input_type_shape"))
        outputs, _ = _shapes(args.get("output_type_shape"))
        found[i].kernels.append(Kernel(name[: -len(KERNEL_SUFFIX)], str(args.get("op_name", "?")), float(e["dur"]),
                                       inputs, dtypes, outputs))
    return found
