"""`xformopt serve --ray`: the same app as a Ray Serve deployment on a Ray head started on 127.0.0.1."""

from __future__ import annotations

import time

import httpx
import pytest
from serve_helpers import free_port

pytestmark = [pytest.mark.integration, pytest.mark.extra("serve")]


def test_ray_serve_deployment_answers_as_the_artifact(served_classifier, sample_texts):
    import ray
    from ray import serve

    from xformopt.runtime.predictor import load_predictor
    from xformopt.serve import ray_serve
    from xformopt.serve.app import ServeConfig

    port = free_port()
    config = ServeConfig(str(served_classifier), threads=1)
    try:
        url = ray_serve.start(config, "local", "127.0.0.1", port, replicas=2)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        texts = sample_texts[:6]
        replies = [httpx.post(f"{url}/predict", json={"inputs": [t]}, timeout=60) for t in texts]
        assert [r.status_code for r in replies] == [200] * len(texts)
        want = load_predictor(served_classifier).predict(texts, batch_size=1)
        for reply, expected in zip(replies, want):
            got = reply.json()[0]
            assert [g["label"] for g in got] == [e["label"] for e in expected]
            assert [g["score"] for g in got] == pytest.approx([e["score"] for e in expected], abs=1e-5)
        assert httpx.post(f"{url}/predict", json={"inputs": 3}, timeout=60).status_code == 422
        assert "xformopt_requests_total" in httpx.get(f"{url}/metrics", timeout=60).text
        status = serve.status().applications[ray_serve.APP_NAME]
        assert status.deployments["XformoptServe"].replica_states.get("RUNNING") == 2
    finally:
        serve.shutdown()
        ray.shutdown()
