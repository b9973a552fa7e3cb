"""Hub ids download through huggingface_hub, tested for real against a stand-in hub on 127.0.0.1
(HF_ENDPOINT): the two endpoints snapshot_download calls, serving a tiny model built in code."""

from __future__ import annotations

import hashlib
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from harden_helpers import one_error, quick_recipe
from helpers import run_cli

REPO = "tiny-org/tiny-bert"
SHA = "0123456789abcdef0123456789abcdef01234567"


class StandInHub(BaseHTTPRequestHandler):
    """GET /api/models/{repo}[/revision/{rev}] (model info: sha, siblings) and HEAD/GET
    /{repo}/resolve/{rev}/{file} (X-Repo-Commit, ETag, Content-Length), the way the Hub answers."""

    files: dict[str, bytes] = {}
    seen: list[str] = []

    def log_message(self, *args):  # keep pytest output clean
        pass

    def _error(self, code: str, status: int = 404):
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("Content-Type", "application/json")
        body = json.dumps({"error": code}).encode()
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _serve(self, with_body: bool):
        self.seen.append(f"{self.command} {self.path}")
        path = self.path.split("?")[0]
        info_prefix, resolve_prefix = f"/api/models/{REPO}/revision/", f"/{REPO}/resolve/"
        if path == f"/api/models/{REPO}":  # no revision: the default branch
            path = info_prefix + "main"
        tree_prefix = f"/api/models/{REPO}/tree/"  # huggingface_hub 2.x lists a snapshot's files here
        if path.startswith(tree_prefix):
            revision = path[len(tree_prefix):].split("/")[0]
            if revision not in ("main", SHA):
                return self._error("RevisionNotFound")
            body = json.dumps([{"type": "file", "path": name, "size": len(data),
                                "oid": hashlib.sha1(data).hexdigest()} for name, data in sorted(self.files.items())]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if with_body:
                self.wfile.write(body)
            return
        if path.startswith("/api/models/") and not path.startswith(info_prefix):
            return self._error("RepoNotFound")
        if path.startswith(info_prefix):
            if path[len(info_prefix):] not in ("main", SHA):
                return self._error("RevisionNotFound")
            body = json.dumps({"id": REPO, "modelId": REPO, "sha": SHA,
                               "siblings": [{"rfilename": name} for name in sorted(self.files)]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
        elif path.startswith(resolve_prefix):
            revision, _, name = path[len(resolve_prefix):].partition("/")
            if revision not in ("main", SHA):
                return self._error("RevisionNotFound")
            if name not in self.files:
                return self._error("EntryNotFound")
            body = self.files[name]
            self.send_response(200)
            self.send_header("X-Repo-Commit", SHA)
            self.send_header("ETag", f'"{hashlib.sha256(body).hexdigest()}"')
        else:
            return self._error("RepoNotFound")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if with_body:
            self.wfile.write(body)

    def do_GET(self):
        self._serve(True)

    def do_HEAD(self):
        self._serve(False)


@pytest.fixture
def online(monkeypatch, empty_hub_cache):
    """Undo the suite's HF_HUB_OFFLINE=1 for one test (constants and the cached HTTP session)."""
    import huggingface_hub.constants as constants
    from huggingface_hub.utils._http import close_session as reset_sessions  # huggingface_hub 1.x: httpx clients

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    reset_sessions()
    yield empty_hub_cache
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    reset_sessions()


@pytest.fixture
def hub(online, tiny_classifier, monkeypatch):
    StandInHub.files = {p.name: p.read_bytes() for p in Path(tiny_classifier).iterdir() if p.is_file()}
    StandInHub.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), StandInHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    yield StandInHub
    server.shutdown()
    server.server_close()


def test_hub_id_downloads_and_the_manifest_records_the_commit(hub, online, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(["export", f"{REPO}@main", "-o", tmp_path / "e"], capsys)
    assert code == 0, err
    manifest = json.loads((tmp_path / "e" / "manifest.json").read_text())
    assert manifest["input"]["revision"] == SHA and manifest["input"]["source"] == f"{REPO}@main"
    snapshot = online / "models--tiny-org--tiny-bert" / "snapshots" / SHA
    assert Path(manifest["input"]["path"]) == snapshot
    assert (snapshot / "model.safetensors").read_bytes() == hub.files["model.safetensors"]
    assert any(s.startswith(f"GET /api/models/{REPO}/revision/main") for s in hub.seen)
    assert any(s.startswith(f"GET /{REPO}/resolve/{SHA}/model.safetensors") for s in hub.seen)


def test_optimize_a_hub_id(hub, tmp_path, heldout_file, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(["optimize", REPO, "-r", quick_recipe(tmp_path, heldout_file), "-o", tmp_path / "o"], capsys)
    assert code == 0, err
    assert json.loads((tmp_path / "o" / "manifest.json").read_text())["input"]["revision"] == SHA


@pytest.mark.parametrize(("model", "fragment"), [
    (f"{REPO}@no-such-branch", "has no revision 'no-such-branch'"),
    ("tiny-org/missing", "no repository tiny-org/missing"),
])
def test_hub_refusals_are_one_line(hub, tmp_path, capsys, monkeypatch, model, fragment):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(["export", model, "-o", tmp_path / "e"], capsys)
    one_error(code, err, fragment)


def test_unreachable_hub_is_one_line_naming_the_id(online, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    code, _, err = run_cli(["export", REPO, "-o", tmp_path / "e"], capsys)
    one_error(code, err, REPO, "not reachable", "local path")


@pytest.mark.parametrize("endpoint", ["not-a-url", "ftp://127.0.0.1", "http://[::1"])
def test_malformed_hf_endpoint_is_one_line(endpoint, online, tmp_path, capsys, monkeypatch):
    """Found by review: HF_ENDPOINT=not-a-url was MissingSchema, exit 3."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    code, _, err = run_cli(["export", REPO, "-o", tmp_path / "e"], capsys)
    one_error(code, err, REPO, "HF_ENDPOINT")
    assert not (tmp_path / "e").exists()


def test_offline_by_the_user_is_one_line(empty_hub_cache, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, _, err = run_cli(["export", f"{REPO}@v1", "-o", tmp_path / "e"], capsys)
    one_error(code, err, REPO, "HF_HUB_OFFLINE=1", "local path")


def test_a_downloaded_id_works_offline_afterwards(hub, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert run_cli(["export", REPO, "-o", tmp_path / "a"], capsys)[0] == 0
    requests = len(hub.seen)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, _, err = run_cli(["export", REPO, "-o", tmp_path / "b"], capsys)
    assert code == 0, err
    first, again = (json.loads((tmp_path / d / "manifest.json").read_text())["input"] for d in ("a", "b"))
    assert again["revision"] == first["revision"] == SHA and again["path"] == first["path"]  # the same snapshot
    assert len(hub.seen) == requests  # nothing asked of the hub offline


@pytest.mark.parametrize("model", ["org/name@", "a/b/c@x", "bad id"])
def test_not_a_hub_id(model, tmp_path, capsys, monkeypatch, empty_hub_cache):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(["export", model, "-o", tmp_path / "e"], capsys)
    one_error(code, err)


@pytest.mark.parametrize("quiet", [False, True], ids=["default", "-q"])
def test_quiet_silences_the_download_bars_of_huggingface_hub(quiet, hub, tmp_path, capsys, monkeypatch):
    """Issue 21: huggingface_hub draws its own tqdm bars on stderr; -q must silence them too (and
    without -q they are there, so the quiet case is not quiet by accident)."""
    from huggingface_hub.utils import are_progress_bars_disabled

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    code, _, err = run_cli([*(["-q"] if quiet else []), "export", REPO, "-o", tmp_path / "e"], capsys)
    assert code == 0, err
    assert any(s.startswith(f"GET /{REPO}/resolve/") for s in hub.seen)  # it did download
    import transformers.utils.logging as transformers_logging

    if quiet:
        assert err == ""
        assert are_progress_bars_disabled() and not transformers_logging.is_progress_bar_enabled()  # shard bars too
    else:
        assert "Fetching" in err and "100%" in err, err  # huggingface_hub's own bar
    from xformopt.cli import output

    output.set_quiet(False)  # quiet mode off again: the bars are back for whatever runs next in this process
    assert not are_progress_bars_disabled() and transformers_logging.is_progress_bar_enabled()
