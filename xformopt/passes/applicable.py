"""Which passes (and pass modes) a model's task takes: checked before any work, in one line."""

from __future__ import annotations

from xformopt.errors import InputError


def check_passes(steps, spec) -> None:
    """Fail before any work when a step (pass name, options) of the chain cannot take ``spec``'s task."""
    task = spec.task_def
    for name, options in steps:
        options = options or {}
        if name not in task.passes:
            raise InputError(f"unsupported architecture {spec.model_type!r} for pass {name!r}: {task.name} models "
                             f"support {', '.join(task.passes)}")
        if name != "quantize":
            continue
        if options.get("mode") == "int4" and not task.decoder:
            raise InputError(f"quantize --mode int4 is for decoders (text-generation); {spec.model_type!r} is an encoder: "
                             "use --mode dynamic or static")
        if task.decoder and (options.get("mode") == "static" or options.get("max_accuracy_drop") is not None):
            raise InputError("decoders (text-generation) support dynamic INT8 only: static calibration and the accuracy "
                             "budget feed encoder inputs; use --mode dynamic without --max-accuracy-drop")
