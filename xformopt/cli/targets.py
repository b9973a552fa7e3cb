"""`xformopt targets list|detect`: the hardware profiles and what this host runs."""

from __future__ import annotations

import typer
from rich.table import Table

from xformopt.cli import options as opt, output
from xformopt.measure.host import effective_cpu_flags, host_info
from xformopt.targets import PROFILES, detect as detect_target, host_supports

app = typer.Typer(help="Hardware profiles.\n\nExample: xformopt targets detect", no_args_is_help=True)


@app.command("list")
def list_targets(as_json: opt.Json = False, quiet: opt.Quiet = False) -> None:
    """List the hardware profiles and the INT8 formats each one emits.

    Example: xformopt targets list
    """
    flags = effective_cpu_flags()
    if as_json:
        output.emit_json([{**t.to_dict(), "host_supports": host_supports(t, flags)} for t in PROFILES.values()])
        return
    table = Table("Target", "Needs", "Weights", "Reduce-range", "Per-channel", "This host", "Description")
    for t in PROFILES.values():
        q = t.quant
        table.add_row(
            t.name, ", ".join(t.requires), q.weight_type, str(q.reduce_range), str(q.per_channel),
            "yes" if host_supports(t, flags) else "no", t.description,
        )
    output.stdout.print(table)


@app.command("detect")
def detect(as_json: opt.Json = False, quiet: opt.Quiet = False) -> None:
    """Print the target `auto` picks on this host, and the CPU facts it used.

    Example: xformopt targets detect --json | jq -r .target
    """
    target = detect_target()
    info = host_info()
    if as_json:
        output.emit_json({"target": target.name, "cpu_model": info["cpu_model"], "cpu_flags": info["cpu_flags"],
                          "int8_gemm_saturates": info["int8_gemm_saturates"], "cores_usable": info["cores_usable"]})
        return
    output.stdout.print(f"{target.name}", highlight=False)
    kernel = {True: "saturates (no VNNI path)", False: "32-bit accumulation (VNNI)", None: "unknown"}
    output.log(f"{info['cpu_model']}; flags: {', '.join(info['cpu_flags'])}; ONNX Runtime's u8*s8 kernel: "
               f"{kernel[info['int8_gemm_saturates']]}; {info['cores_usable']} usable cores")
