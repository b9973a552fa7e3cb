"""Hardware profiles as data, and host detection.

A profile decides what the passes emit for a CPU family: INT8 formats (weights signed or unsigned,
reduce-range where the instruction set saturates without VNNI, per-channel scales), which ONNX
Runtime fusions are allowed, and the session settings used to time the result. Adding a target is
adding a row to ``PROFILES``, not an if-chain in a pass.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from xformopt.errors import InputError
from xformopt.measure.host import effective_cpu_flags


@dataclass(frozen=True)
class QuantFormat:
    weight_type: str  # "int8" | "uint8"
    activation_type: str  # "uint8" | "int8": static activations (dynamic quantization is always uint8)
    reduce_range: bool  # 7-bit weights: avoids u8*s8 pair-sum saturation in VPMADDUBSW (no VNNI)
    per_channel: bool
    quant_format: str  # "QOperator" | "QDQ": how static INT8 is written (dynamic is always QOperator)
    op_types: tuple[str, ...]  # ops quantized by default
    activation_symmetric: bool = False  # static: zero-point fixed at 0 (int8 activations) vs. calibrated


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    requires: tuple[str, ...]  # host CPU flags (any-of groups joined by "|") the kernels need
    quant: QuantFormat
    simd_multiple: int  # kept dimensions round to this after pruning (issue 5)
    fusion_disabled: tuple[str, ...] = ()  # FusionOptions attributes to turn off for this target
    session: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


_X86_OPS = ("MatMul", "Attention", "Gemm")

# ONNX Runtime's CPU INT8 GEMM on x86 computes u8 activations x s8 weights. Without VNNI it uses
# VPMADDUBSW, whose 16-bit pair sums can saturate with full 8-bit weights, so those targets reduce
# weights to 7 bits (ORT's documented remedy). VNNI accumulates straight into 32 bits: full range.
# Every x86 profile uses per-channel scales: with 7-bit weights a per-tensor scale leaves the
# small-magnitude channels a handful of levels (MiniLM on an AVX2 host: output cosine 0.858
# per-tensor vs 0.991 per-channel, see docs/results/encoders.md, "INT8 formats").
PROFILES: dict[str, Target] = {
    t.name: t
    for t in (
        Target(
            name="avx2",
            description="x86-64 with AVX2/FMA (Haswell and later, Zen 1-3)",
            requires=("avx2",),
            quant=QuantFormat("int8", "uint8", True, True, "QOperator", _X86_OPS),
            simd_multiple=8,
        ),
        Target(
            name="avx512",
            description="x86-64 with AVX-512 F/BW but no VNNI (Skylake-SP)",
            requires=("avx512f", "avx512bw"),
            quant=QuantFormat("int8", "uint8", True, True, "QOperator", _X86_OPS),
            simd_multiple=16,
        ),
        Target(
            name="avx512_vnni",
            description="x86-64 with AVX-512 VNNI (Cascade Lake+, Ice Lake+, Zen 4/5)",
            requires=("avx512f", "avx512bw", "avx512_vnni|avx512vnni"),
            # Static QOperator (QLinearMatMul) over QDQ, measured on an AVX-512 VNNI host (2 cores,
            # fused all-MiniLM-L6-v2, batch 1, 200 interleaved rounds over validation texts, median
            # relative to fp32): QOperator 0.605, QDQ 0.651; with Attention dynamically quantized
            # (QAttention, see passes/quantize/run.py) 0.425; dynamic INT8 0.367.
            quant=QuantFormat("int8", "uint8", False, True, "QOperator", _X86_OPS),
            simd_multiple=16,
        ),
        Target(
            name="avx_vnni",
            description="x86-64 with AVX-VNNI but no AVX-512 (Alder Lake and later client cores)",
            requires=("avx2", "avx_vnni"),
            quant=QuantFormat("int8", "uint8", False, True, "QOperator", _X86_OPS),
            simd_multiple=8,
        ),
        Target(
            name="arm64",
            description="64-bit Arm with NEON dot-product (Graviton 2+, Apple M-series, Ampere)",
            # Linux's /proc/cpuinfo says asimd; macOS's sysctl says neon / advsimd.
            requires=("asimd|neon|advsimd",),
            # Arm kernels take signed or unsigned weights at full range; S8 weights with per-channel
            # scales are ORT's recommended default there. Static stays u8 asymmetric QOperator until
            # measured on an Arm host: ORT suggests symmetric s8 activations in QDQ form for Arm, which
            # `quantize` can emit (quant_format: QDQ, activation_type: int8, activation_symmetric).
            quant=QuantFormat("int8", "uint8", False, True, "QOperator", _X86_OPS),
            simd_multiple=16,
        ),
    )
}

DETECTION_ORDER = ("avx512_vnni", "avx512", "avx_vnni", "avx2", "arm64")


VNNI_FLAGS = frozenset({"avx512_vnni", "avx512vnni", "avx_vnni"})


def u8s8_saturates(flags: set[str]) -> bool:
    """True on x86 hosts whose INT8 GEMM pairs u8*s8 products in 16 bits (AVX2/AVX-512 without VNNI)."""
    return "avx2" in flags and not (VNNI_FLAGS & flags)


def host_supports(target: Target, flags: set[str]) -> bool:
    """True when every requirement (an any-of group separated by '|') is in the host's flags."""
    return all(any(opt in flags for opt in req.split("|")) for req in target.requires)


def detect(flags: set[str] | None = None) -> Target:
    """The best profile the host runs; raises when none does (e.g. x86 without AVX2)."""
    if flags is None:
        flags = effective_cpu_flags()
    for name in DETECTION_ORDER:
        if host_supports(PROFILES[name], flags):
            return PROFILES[name]
    raise InputError(
        "could not detect a supported target on this host (needs AVX2, AVX-512 or Arm NEON); "
        f"pass --target with one of: {', '.join(PROFILES)}"
    )


def resolve(name: str) -> Target:
    """A profile by name; ``auto`` detects the host."""
    if name == "auto":
        return detect()
    try:
        return PROFILES[name]
    except KeyError:
        raise InputError(
            f"unknown target {name!r}; choose one of: auto, {', '.join(PROFILES)} (see `xformopt targets list`)"
        ) from None
