"""xformopt search: the space is validated like a recipe, trials are pipeline runs scored on the
validation split, the front is re-measured, outputs follow xformopt.search/1, --resume continues,
and Ray (a real `ray start --head` cluster on 127.0.0.1) gives the local run's trials and survives
a killed worker. Tiny models from conftest; every search here shares one pass cache."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import extras
import onnx
import pytest
import yaml
from helpers import error_lines, run_cli

extras.require("search")

from xformopt import recipe as recipes  # noqa: E402
from xformopt.errors import InputError  # noqa: E402
from xformopt.recipe_search import run as runner  # noqa: E402
from xformopt.recipe_search import sampler as samplers  # noqa: E402
from xformopt.recipe_search import space as spaces  # noqa: E402
from xformopt.recipe_search.front import pareto  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CHOICES = {"fuse.select": ["all", "none"], "quantize.per_channel": [True, False]}


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("search-cache")


@pytest.fixture(scope="module")
def space_file(tmp_path_factory, heldout_file) -> Path:
    """A tiny base recipe (few rows, few rounds) and a 4-point space over it."""
    root = tmp_path_factory.mktemp("space")
    base = root / "tiny.yaml"
    base.write_text(yaml.safe_dump({
        "name": "tiny", "passes": ["export", {"fuse": {"select": "all"}}, "quantize"],
        "evaluation": {"data": str(heldout_file), "limit": 16, "latency_rounds": 3, "warmup": 1, "repeats": 1},
    }))
    space = root / "space.yaml"
    space.write_text(yaml.safe_dump({"name": "tiny", "recipe": str(base), "choices": CHOICES,
                                     "validation": {"limit": 64}}, sort_keys=False))
    return space


def settings(model, out, space_file, **kw) -> runner.Settings:
    return runner.Settings(model=str(model), out=out, space=spaces.load(str(space_file)), trials=kw.pop("trials", 4),
                           seed=0, remeasure_rounds=5, remeasure_rows=16, **kw)


# --------------------------------------------------------------------------- the space


def write_space(tmp_path, text: str) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("text, key, line", [
    ("choices:\n  fuse.select: [all, sometimes]\n", "choices.fuse.select.1", 2),
    ("choices:\n  quantize.mode: [dynamic]\n  prune.nonsense: [1]\n", "choices.prune.nonsense", 3),
    ("choices:\n  frobnicate.x: [1]\n", "choices.frobnicate.x", 2),
    ("choices:\n  prune.sparsity: 0.5\n", "choices.prune.sparsity", 2),
    ("choices:\n  prune.sparsity: [0.5, 0.5]\n", "choices.prune.sparsity", 2),
    ("choices:\n  prune.sparsity: [1.5]\n", "choices.prune.sparsity.0", 2),
    ("name: x\nchoises:\n  fuse.select: [all]\n", "choises", 2),
])
def test_space_errors_are_one_line_naming_file_line_and_key(tmp_path, capsys, text, key, line):
    path = write_space(tmp_path, text)
    code, out, err = run_cli(["search", "minilm", "-o", tmp_path / "s", "--space", path], capsys)
    assert code == 2, err
    lines = error_lines(err)
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert f"{path}:{line}: {key}:" in lines[0]
    assert not (tmp_path / "s").exists()


def test_choices_that_make_a_broken_recipe_are_refused(tmp_path):
    # prune-distill-int8 prunes to an explicit shape: a sparsity choice contradicts it
    path = write_space(tmp_path, "recipe: prune-distill-int8\nchoices:\n  prune.sparsity: [0.3]\n")
    with pytest.raises(InputError, match="exclusive"):
        spaces.load(str(path))


def test_presets_validate_and_a_missing_pass_is_inserted_in_chain_order():
    for name in spaces.preset_names():
        space = spaces.load(preset=name)
        params = {k: v[0] for k, v in space.choices.items()}
        assert space.recipe_for(params).passes
    space = spaces.load(preset="encoder")
    r = space.recipe_for({k: v[-1] for k, v in space.choices.items()})
    assert [s.name for s in r.passes] == ["prune", "distill", "export", "fuse", "quantize"]
    prune = spaces.load(preset="encoder-prune")
    off = prune.recipe_for({k: (False if k == "prune.enabled" else v[0]) for k, v in prune.choices.items()})
    assert [s.name for s in off.passes] == ["export", "fuse", "quantize"]


def test_sampler_proposes_valid_recipes_from_the_choices(tmp_path):
    space = spaces.load(preset="encoder")
    study = samplers.open_study(tmp_path, "nsga2", 3, ["accuracy", "latency"], resume=False)
    seen = set()
    for i in range(12):
        trial = study.ask()
        params = samplers.propose(trial, space.choices)
        assert all(params[k] in v for k, v in space.choices.items())
        r = space.recipe_for(params)
        options = {s.name: s.options for s in r.passes}
        assert options["prune"]["sparsity"] == params["prune.sparsity"]
        assert options["quantize"]["mode"] == params["quantize.mode"]
        seen.add(json.dumps(params, sort_keys=True))
        study.tell(trial, [0.5 + i / 100, 10.0 - i])
    assert len(seen) > 3  # it explores, not one point
    assert (tmp_path / "optuna.journal").is_file()


def test_pareto_front():
    pts = [{"metric": 0.9, "latency_ms": 5}, {"metric": 0.8, "latency_ms": 2}, {"metric": 0.7, "latency_ms": 3},
           {"metric": 0.9, "latency_ms": 6}, {"metric": 0.95, "latency_ms": 9}]
    assert [(p["metric"], p["latency_ms"]) for p in pareto(pts)] == [(0.8, 2), (0.9, 5), (0.95, 9)]
    # re-measure candidates: front by front, so a cap drops the points furthest behind, never a front point
    from xformopt.recipe_search.front import layers

    ordered = [(p["metric"], p["latency_ms"]) for p in layers(pts, len(pts))]
    assert ordered == [(0.9, 5), (0.8, 2), (0.95, 9), (0.7, 3), (0.9, 6)]


def test_ray_flag_without_ray_names_the_extra(tmp_path, capsys, monkeypatch, space_file):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    code, _, err = run_cli(["search", "minilm", "-o", tmp_path / "s", "--space", space_file, "--ray", "auto"], capsys)
    assert code == 2
    assert error_lines(err) == ["error: --ray needs Ray, an optional extra: pip install 'xformopt[ray]'"]
    assert not (tmp_path / "s").exists()


# --------------------------------------------------------------------------- a local search


@pytest.fixture(scope="module")
def local_search(tmp_path_factory, tiny_classifier, space_file, shared_cache):
    out = tmp_path_factory.mktemp("local") / "search"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XFORMOPT_CACHE_DIR", str(shared_cache))
        # two workers: a process pool, one thread per trial, as the Ray run below declares
        doc = runner.search(settings(tiny_classifier, out, space_file, workers=2))
    return out, doc


def test_local_search_writes_the_schema(local_search, tiny_classifier):
    out, doc = local_search
    on_disk = json.loads((out / "search.json").read_text())
    assert on_disk["schema"] == "xformopt.search/1"
    assert on_disk["executor"] == {"kind": "local", "address": None, "workers": 2}
    assert on_disk["metric"]["split"] == "validation" and on_disk["metric"]["rows"] == 64
    distinct = [t for t in on_disk["trials"] if "duplicate_of" not in t]
    assert len(distinct) == 4 and len({json.dumps(t["params"], sort_keys=True) for t in distinct}) == 4
    complete = [t for t in on_disk["trials"] if t["status"] == "complete"]
    assert complete and all(0.0 <= t["metric"] <= 1.0 for t in complete)
    assert on_disk["front"]
    for point in on_disk["front"]:
        assert set(point) == {"trial", "artifact", "metric", "latency_ms", "recipe"}
        assert not Path(point["artifact"]).is_absolute()
        assert (out / point["artifact"] / "model.onnx").is_file()
        assert (out / point["artifact"] / "report.json").is_file()
        trial = next(t for t in complete if t["trial"] == point["trial"])
        assert point["latency_ms"] == trial["remeasured_latency_ms"]  # the front is over re-measured latency
    assert on_disk["reference_int8"]["metric"] > 0 and on_disk["reference_int8"]["latency_ms"] > 0
    optimum = on_disk["optimum_int8"]  # optimum's own ORTQuantizer artifact, timed in the same interleave
    assert optimum["artifact"] == "optimum-int8" and optimum["latency_ms"] > 0 and 0 <= optimum["metric"] <= 1
    ops = {n.op_type for n in onnx.load(str(out / "optimum-int8" / "model.onnx")).graph.node}
    assert {"MatMulInteger", "DynamicQuantizeLinear"} <= ops
    assert {"pytorch", "reference-int8", "optimum-int8"} <= set(on_disk["remeasure"]["latency"])
    assert "dynamic INT8, optimum's settings" in (out / "search.md").read_text()
    assert (out / "pareto.png").stat().st_size > 1000
    assert "| trial" in (out / "search.md").read_text()


def test_trial_metric_is_the_validation_split_not_the_test_rows(local_search, tiny_classifier):
    """Re-score a front artifact independently on the validation split: it matches search.json."""
    import numpy as np

    from xformopt import sources
    from xformopt.data import load_text_dataset
    from xformopt.recipe_search.trial import outputs_path
    from xformopt.resources import vader_split_path
    from xformopt.runtime.encoder import OrtPredictor

    out, doc = local_search
    spec = sources.resolve(str(tiny_classifier))
    data = load_text_dataset(vader_split_path("validation"), label2id=spec.label2id, require_labels=True, limit=64, seed=0)
    for point in doc["front"]:
        outputs = OrtPredictor(spec, out / point["artifact"]).predict(data.texts)
        assert abs(float(np.mean(outputs.argmax(-1) == np.asarray(data.labels))) - point["metric"]) < 1e-9
        # the trial keeps those outputs beside its artifact (the shape search's intervals read them)
        np.testing.assert_allclose(np.load(outputs_path(out / point["artifact"])), outputs, rtol=1e-5, atol=1e-6)


def test_best_recipe_is_accepted_by_optimize(local_search, tiny_classifier, tmp_path, capsys, monkeypatch, shared_cache):
    out, doc = local_search
    best = out / "best-recipe.yaml"
    r = recipes.load(str(best))
    trial = next(t for t in doc["trials"] if t["trial"] == doc["best"]["trial"])
    assert [s.to_yaml_obj() for s in r.passes] == trial["recipe"]["passes"]
    monkeypatch.setenv("XFORMOPT_CACHE_DIR", str(shared_cache))
    code, _, err = run_cli(["optimize", tiny_classifier, "--recipe", best, "-o", tmp_path / "again", "-q"], capsys)
    assert code == 0, err
    assert (tmp_path / "again" / "model.onnx").is_file()


def test_existing_search_needs_resume_or_force(local_search, tiny_classifier, space_file):
    out, _ = local_search
    with pytest.raises(InputError, match="--resume"):
        runner.search(settings(tiny_classifier, out, space_file))


def test_resume_continues(tmp_path, tiny_classifier, space_file, shared_cache, monkeypatch):
    monkeypatch.setenv("XFORMOPT_CACHE_DIR", str(shared_cache))
    out = tmp_path / "search"
    first = runner.search(settings(tiny_classifier, out, space_file, trials=2, workers=1))
    stamps = {t["trial"]: (out / t["artifact"] / "model.onnx").stat().st_mtime_ns
              for t in first["trials"] if "duplicate_of" not in t}
    more = runner.search(settings(tiny_classifier, out, space_file, trials=3, workers=1, resume=True))
    assert sum("duplicate_of" not in t for t in more["trials"]) == 3  # --trials counts distinct recipes
    def ran(trials):  # what each trial was and gave (not the re-measurement, which every run redoes)
        return [{k: v for k, v in t.items() if k != "remeasured_latency_ms"} for t in trials]

    assert ran(more["trials"][:len(first["trials"])]) == ran(first["trials"])
    for number, stamp in stamps.items():  # the first two were not run again
        assert (out / "trials" / f"{number:03d}" / "model.onnx").stat().st_mtime_ns == stamp
    with pytest.raises(InputError, match="other seed"):
        runner.search(runner.Settings(**{**settings(tiny_classifier, out, space_file, trials=3).__dict__,
                                         "seed": 1, "resume": True}))


# --------------------------------------------------------------------------- Ray


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_cluster():
    """`ray start --head --block` on 127.0.0.1 with 2 CPUs, its own temp dir; ended by its own pid."""
    port = free_port()
    temp = tempfile.mkdtemp(prefix="xfray", dir="/tmp")  # short: Ray's socket paths must fit in 107 bytes
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "RAY_USAGE_STATS_ENABLED": "0", "OMP_WAIT_POLICY": "PASSIVE",
           # Ray >= 2.52 turns token auth on when it finds ~/.ray/auth_token (left by any earlier local
           # ray.init), which this process, having imported ray without a token, cannot present. The test
           # cluster listens on this host only and says explicitly that it takes no token.
           "RAY_AUTH_MODE": "disabled"}
    ray_bin = Path(sys.executable).with_name("ray")
    head = subprocess.Popen(
        [str(ray_bin), "start", "--head", "--block", "--num-cpus", "2", "--node-ip-address", "127.0.0.1",
         "--port", str(port), "--temp-dir", temp, "--include-dashboard", "false", "--disable-usage-stats",
         "--object-store-memory", str(100 * 1024 * 1024)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    address = f"127.0.0.1:{port}"
    import ray as ray_mod

    deadline = time.monotonic() + 120
    while True:
        try:
            ray_mod.init(address=address, log_to_driver=False)
            ray_mod.shutdown()
            break
        except Exception:
            if head.poll() is not None or time.monotonic() > deadline:
                head.kill()
                pytest.fail(f"ray start failed: {head.stderr.read().decode()[-2000:]}")
            time.sleep(1)
    yield address
    os.killpg(head.pid, signal.SIGTERM)  # the session `ray start --block` leads: the processes it started
    try:
        # Ray's graceful stop takes about 34 s here; the cluster holds nothing worth keeping, and its idle
        # workers (in their own sessions) exit by themselves within seconds once the raylet is gone.
        head.wait(timeout=5)
    except subprocess.TimeoutExpired:
        os.killpg(head.pid, signal.SIGKILL)
        head.wait()
    shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.integration
@pytest.mark.extra("ray")
def test_ray_gives_the_local_trials(ray_cluster, local_search, tiny_classifier, space_file, shared_cache, tmp_path, monkeypatch):
    monkeypatch.setenv("XFORMOPT_CACHE_DIR", str(shared_cache))
    doc = runner.search(settings(tiny_classifier, tmp_path / "search", space_file, ray=ray_cluster))
    assert doc["executor"]["kind"] == "ray" and doc["executor"]["address"] == ray_cluster
    assert doc["executor"]["workers"] == 2
    _, local = local_search

    def key(trials):
        return [(t["trial"], t["params"], t["status"], t.get("metric")) for t in trials]

    assert key(doc["trials"]) == key(local["trials"])
    assert {t.get("host") for t in doc["trials"] if "duplicate_of" not in t} == {socket.gethostname()}


@pytest.mark.integration
@pytest.mark.extra("ray")
def test_ray_retries_a_killed_worker(ray_cluster, tiny_classifier, space_file, shared_cache, tmp_path, monkeypatch):
    monkeypatch.setenv("XFORMOPT_CACHE_DIR", str(shared_cache))
    out = tmp_path / "search"
    killed: list[int] = []
    stop = threading.Event()

    def killer():  # SIGKILL the first trial's Ray worker as soon as it starts working on it
        while not stop.is_set() and not killed:
            for marker in (out / "trials").glob("*.worker") if (out / "trials").is_dir() else []:
                pid = int(marker.read_text().split()[1])
                if pid != os.getpid():
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                    break
            time.sleep(0.02)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    try:
        doc = runner.search(settings(tiny_classifier, out, space_file, trials=2, ray=ray_cluster, workers=1))
    finally:
        stop.set()
        thread.join()
    assert killed, "no Ray worker was seen running a trial"
    assert all(t["status"] == "complete" for t in doc["trials"]), doc["trials"]
    assert max(t.get("attempts", 1) for t in doc["trials"]) >= 2  # the killed trial ran again
    assert doc["front"]


def test_an_interrupted_local_search_ends_its_running_trials():
    """close(abort=True), what an interrupted search calls: the pool's busy workers are ended, not
    waited for (a distillation trial runs for minutes)."""
    import time as clock

    from xformopt.recipe_search.executors.local import PoolExecutor

    executor = PoolExecutor(2)
    busy = [executor._pool.submit(clock.sleep, 600) for _ in range(2)]
    deadline = clock.monotonic() + 120
    while not all(f.running() for f in busy) and clock.monotonic() < deadline:
        clock.sleep(0.05)
    processes = list(executor._pool._processes.values())
    alive = [p.is_alive() for p in processes]
    assert processes and all(alive), (alive, [f.running() for f in busy])
    started = clock.monotonic()
    executor.close(abort=True)
    assert not any(p.is_alive() for p in processes), [p.exitcode for p in processes]
    assert not any(f.done() and not f.cancelled() and f.exception() is None for f in busy)  # none ran to the end
    assert clock.monotonic() - started < 300  # far less than the 600 s the sleeping "trials" would take


def test_a_new_training_prefix_brings_its_cheap_variants():
    """--expand: the fuse/quantize variants of a prune/distill choice reuse its trained model, so they
    are queued; a space with nothing to train has no siblings (the sampler chooses freely)."""
    space = spaces.load(preset="encoder")
    cheap = space.cheap_keys()
    assert cheap == ["fuse.select", "quantize.mode", "quantize.max_accuracy_drop"]
    params = {k: v[0] for k, v in space.choices.items()}
    siblings = space.siblings(params)
    assert len(siblings) == 3 and params not in siblings  # 1 fusion x 2 modes x 2 budgets, less itself
    assert all({k: s[k] for k in space.choices if k not in cheap} ==
               {k: params[k] for k in space.choices if k not in cheap} for s in siblings)
    assert spaces.load(preset="encoder-int8").siblings({k: v[0] for k, v in spaces.load(preset="encoder-int8").choices.items()}) == []
