"""Which connections `xformopt optimize`, `serve` (alive with requests) and `bench` open, and a plain ONNX
Runtime session for comparison: each under a recording proxy (scripts/record_connections.py), in a HOME
of its own, optionally under strace (every connect() the process tree makes, proxy or not).

    python benchmarks/no_telemetry.py MODEL_DIR RECIPE --out results.json [--serve-seconds 60]
        [--control-seconds 35] [--pythonpath OLD_CHECKOUT] [--strace]

``--pythonpath``: run the xformopt found there (e.g. ``git archive <commit> xformopt | tar -x -C DIR``), to
measure a version before the fix. The children get no telemetry switch and no CI variable from this
environment (ONNX Runtime also stays quiet when it sees one: CI, GITHUB_ACTIONS, ...), so whatever
switch is on was set by xformopt itself.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from importlib.metadata import version
from pathlib import Path

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("record_connections", HERE.parent / "scripts" / "record_connections.py")
record_connections = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(record_connections)

ORT_STATE = Path(record_connections.ORT_STATE)

CONTROL = """
import sys, time, numpy as np, onnx, onnxruntime as ort
from onnx import TensorProto, helper
x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
model.ir_version = 8
session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
for _ in range(50):
    session.run(None, {"x": np.ones((1, 4), np.float32)})
time.sleep(float(sys.argv[1]))
"""


def child_env(recorder, home: Path, pythonpath: str | None) -> dict[str, str]:
    env = {k: v for k, v in recorder.environ(bare=True).items() if k != "XDG_CACHE_HOME"}
    env["HOME"] = str(home)
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [pythonpath, env.get("PYTHONPATH")]))
    return env


def traced(command: list[str], trace: Path | None) -> list[str]:
    return ["strace", "-f", "-qq", "-e", "trace=connect", "-o", str(trace), *command] if trace else command


def outside_connects(trace: Path | None) -> list[str] | None:
    """connect() calls to anything but this host (loopback, or a Unix socket), from strace's log."""
    if trace is None:
        return None
    calls = [line for line in trace.read_text().splitlines() if "connect(" in line and "AF_UNIX" not in line]
    local = re.compile(r'inet_addr\("127\.|inet_pton\(AF_INET6, "::1"|sin6_addr=in6addr_loopback')
    return [line for line in calls if not local.search(line)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: dict) -> int:
    # No proxy for the client: its requests go to the server, not to the recorder.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with opener.open(request, timeout=30) as answer:
        return answer.status


def serve_alive(command: list[str], env: dict, port: int, seconds: float) -> dict:
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    started, healthy = time.monotonic(), None
    while healthy is None and time.monotonic() - started < 300 and process.poll() is None:
        try:
            opener.open(f"{url}/health", timeout=2).close()
            healthy = time.monotonic() - started
        except OSError:
            time.sleep(0.2)
    ok = 0
    alive_from = time.monotonic()
    while healthy is not None and time.monotonic() - alive_from < seconds:
        ok += post(f"{url}/predict", {"inputs": ["a fine film", "a dull one"]}) == 200
        time.sleep(0.5)
    # Under strace the server is strace's child: it gets the SIGTERM (strace would only detach from it).
    children = Path(f"/proc/{process.pid}/task/{process.pid}/children")
    pids = children.read_text().split() if command[0] == "strace" and children.exists() else []
    os.kill(int(pids[0]) if pids else process.pid, signal.SIGTERM)
    err = process.communicate(timeout=60)[1].decode(errors="replace")
    return {"healthy_after_s": healthy, "alive_s": round(time.monotonic() - alive_from, 1), "requests_ok": ok,
            "exit": process.returncode, "stderr_tail": err[-400:]}


def run_one(name: str, command: list[str], args, serve_port: int | None = None) -> dict:
    home = Path(tempfile.mkdtemp(prefix=f"home-{name}-"))
    trace = home / "strace.log" if args.strace else None
    with record_connections.Recorder() as recorder:
        env = child_env(recorder, home, args.pythonpath)
        started = time.monotonic()
        if serve_port is not None:
            result = serve_alive(traced(command, trace), env, serve_port, args.serve_seconds)
        else:
            done = subprocess.run(traced(command, trace), env=env, capture_output=True, text=True)
            result = {"exit": done.returncode, "stderr_tail": done.stderr[-400:]}
        result["wall_s"] = round(time.monotonic() - started, 1)
        time.sleep(1)  # a connection opened at the very end still gets its line
        result["connections"] = list(recorder.lines)
    result["ort_state_created"] = sorted(p.name for p in (home / ORT_STATE).glob("*")) if (home / ORT_STATE).exists() \
        else []
    result["outside_connects"] = outside_connects(trace)
    result["command"] = "python -c CONTROL" if name == "control" else shlex.join(["xformopt", *command[3:]])
    shutil.rmtree(home, ignore_errors=True)
    print(f"{name}: {len(result['connections'])} connection(s), ORT state {result['ort_state_created'] or 'none'}, "
          f"exit {result['exit']}, {result['wall_s']} s", file=sys.stderr)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("recipe")
    parser.add_argument("--out", required=True)
    parser.add_argument("--serve-seconds", type=float, default=60)
    parser.add_argument("--control-seconds", type=float, default=35)
    parser.add_argument("--pythonpath")
    parser.add_argument("--strace", action="store_true")
    args = parser.parse_args()
    py = sys.executable
    cli = [py, "-m", "xformopt.cli.app"]
    artifact = Path(tempfile.mkdtemp(prefix="artifact-")) / "out"
    results = {"control: plain onnxruntime session": run_one("control", [py, "-c", CONTROL, str(args.control_seconds)],
                                                             args)}
    results["xformopt optimize"] = run_one("optimize", [*cli, "optimize", args.model, "-r", args.recipe, "-o",
                                                         str(artifact)], args)
    port = free_port()
    results[f"xformopt serve, {args.serve_seconds:.0f} s with requests"] = run_one(
        "serve", [*cli, "serve", str(artifact), "--port", str(port)], args, serve_port=port)
    results["xformopt bench"] = run_one("bench", [*cli, "bench", str(artifact)], args)
    document = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "host": platform.node(),
                "cpu": platform.processor() or platform.machine(), "python": platform.python_version(),
                "onnxruntime": version("onnxruntime"), "xformopt_from": args.pythonpath or "this checkout",
                "strace": args.strace, "results": results}
    Path(args.out).write_text(json.dumps(document, indent=1) + "\n")


if __name__ == "__main__":
    main()
