"""Hardware profiles as data, and detection from CPU flags."""

from __future__ import annotations

import pytest

from xformopt import targets
from xformopt.errors import InputError
from xformopt.targets import PROFILES, detect, host_supports

pytestmark = pytest.mark.host_sensitive


@pytest.mark.parametrize(
    ("name", "reduce_range", "per_channel"),
    [
        ("avx2", True, True),  # VPMADDUBSW saturates with 8-bit weights: 7-bit weights, per-channel scales
        ("avx512", True, True),
        ("avx512_vnni", False, True),  # VNNI accumulates in 32 bits: full range
        ("avx_vnni", False, True),
        ("arm64", False, True),
    ],
)
def test_profile_formats(name, reduce_range, per_channel):
    q = PROFILES[name].quant
    assert q.reduce_range is reduce_range
    assert q.per_channel is per_channel
    assert q.weight_type == "int8"
    assert q.activation_type == "uint8"
    assert q.quant_format == "QOperator"
    assert set(q.op_types) == {"MatMul", "Attention", "Gemm"}


def test_profile_names_and_simd():
    assert list(PROFILES) == ["avx2", "avx512", "avx512_vnni", "avx_vnni", "arm64"]
    assert {n: t.simd_multiple for n, t in PROFILES.items()} == {
        "avx2": 8, "avx512": 16, "avx512_vnni": 16, "avx_vnni": 8, "arm64": 16,
    }
    assert set(targets.DETECTION_ORDER) == set(PROFILES)


def test_to_dict_is_plain_data():
    d = PROFILES["avx512_vnni"].to_dict()
    assert d["name"] == "avx512_vnni"
    assert d["quant"]["reduce_range"] is False
    assert d["requires"] == ("avx512f", "avx512bw", "avx512_vnni|avx512vnni")


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ({"sse4_2", "avx", "avx2", "fma"}, "avx2"),
        ({"avx2", "avx512f", "avx512bw"}, "avx512"),
        ({"avx2", "avx512f", "avx512bw", "avx512_vnni"}, "avx512_vnni"),
        ({"avx2", "avx512f", "avx512bw", "avx512vnni"}, "avx512_vnni"),  # macOS/sysctl spelling
        ({"avx2", "avx_vnni"}, "avx_vnni"),
        ({"avx2", "avx512f"}, "avx2"),  # AVX-512F alone (no BW) is not enough for avx512
        ({"avx2", "avx512f", "avx512_vnni"}, "avx2"),
        ({"fp", "asimd", "asimddp"}, "arm64"),
    ],
)
def test_detect_picks_best_profile(flags, expected):
    assert detect(flags).name == expected


@pytest.mark.parametrize("flags", [set(), {"sse4_2", "avx"}, {"fp"}])
def test_detect_raises_when_nothing_fits(flags):
    with pytest.raises(InputError) as info:
        detect(flags)
    message = info.value.message
    assert info.value.exit_code == 2
    assert "could not detect a supported target" in message
    assert "--target" in message
    for name in PROFILES:
        assert name in message


def test_host_supports_any_of_groups():
    vnni = PROFILES["avx512_vnni"]
    assert host_supports(vnni, {"avx512f", "avx512bw", "avx512vnni"})
    assert host_supports(vnni, {"avx512f", "avx512bw", "avx512_vnni"})
    assert not host_supports(vnni, {"avx512f", "avx512bw"})
    assert not host_supports(vnni, {"avx512_vnni"})


@pytest.mark.parametrize("name", list(PROFILES))
def test_resolve_by_name(name):
    assert targets.resolve(name) is PROFILES[name]


@pytest.mark.parametrize(("flags", "saturates", "expected"), [
    ("asimd", None, "arm64"),
    ("avx2 avx_vnni", "0", "avx_vnni"),
    ("avx2 avx_vnni", "1", "avx2"),  # the flags say VNNI, the kernel probe says it saturates: the probe wins
    ("avx2 avx512f avx512bw avx512_vnni", "0", "avx512_vnni"),
    ("avx2 avx512f avx512bw avx512_vnni", "1", "avx512"),
])
def test_resolve_auto_uses_host_flags_and_probe(monkeypatch, flags, saturates, expected):
    """Flags and the kernel probe are stated together: neither comes from the CPU this runs on."""
    monkeypatch.setenv("XFORMOPT_CPU_FLAGS", flags)
    if saturates is None:
        monkeypatch.delenv("XFORMOPT_INT8_SATURATES", raising=False)
    else:
        monkeypatch.setenv("XFORMOPT_INT8_SATURATES", saturates)
    assert targets.resolve("auto").name == expected


def test_unknown_target_lists_names():
    with pytest.raises(InputError) as info:
        targets.resolve("avx1024")
    message = info.value.message
    assert "unknown target 'avx1024'" in message
    assert "auto" in message
    for name in PROFILES:
        assert name in message
