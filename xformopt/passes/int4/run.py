"""int4: 4-bit weight-only decoders (ONNX Runtime's ``MatMulNBits``), with a mixed plan and a
perplexity budget. Its own pass (``- int4: {...}`` in a recipe, `xformopt int4` on the command line):
it shares no option with INT8 ``quantize``, so neither records the other's.

Decoding at batch 1 reads every weight once per token, so the weight bytes set the speed. ORT's
``MatMulNBitsQuantizer`` packs each weighted MatMul's weights into blocks of ``block_size`` 4-bit
values with one scale (and zero point when asymmetric) per block; ``accuracy_level`` 4 makes the CPU
kernel quantize the activations to int8 and use integer dot products (VNNI where present).
Algorithms: ``rtn`` (ORT's own blockwise round-to-nearest), ``hqq`` (half-quadratic, data-free),
``gptq`` (calibrated on text: the vendored train split unless ``calibration_data`` says otherwise).

Mixed plan. ``keep_8bit`` names roles (``lm_head``, ``attention_output``, ``down_proj``, ``qkv``,
``mlp_in``) whose MatMuls are packed at 8 bits instead (same op, ``bits=8``). With
``max_perplexity_increase`` ("3%" or 0.03), the 4-bit candidate's perplexity on held-out text (the
vendored validation split: neither the calibration nor the report's rows) is compared with the
float input graph's; over budget, the 4-bit MatMuls are ranked by harm (the relative output error of
their simulated 4-bit weights on real activations: passes/int4/harm.py) and the most harmful go to 8 bits, 1, 2, 4 ...
then bisected: the fewest that meet the budget are kept, every candidate timed and recorded.

Decode levers (docs/guides/llms.md, "Decode levers"): ``block_sizes`` per role over ``block_size``;
``kv_cache`` int8 (passes/int4/kv_cache.py); for a model converted from GGUF, ``requantize`` roles
despite the file's blocks and ``exact_gguf`` false (Q4_1 minimums as rounded zero points,
passes/int4/gguf_blocks.py); ``fuse_projections``: same-input MatMuls packed as one (passes/int4/fuse.py).

The pass fails when nothing became 4-bit, and checks the logits against the float graph.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import sys
import time
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from xformopt.artifact import copy_stage
from xformopt.decoder.generate import context_window
from xformopt.decoder.perplexity import perplexity, token_lists
from xformopt.decoder.traffic import role_of
from xformopt.errors import InputError, PassFailed
from xformopt.models import load_tokenizer
from xformopt.passes.base import Pass, PassContext, PassOptions
from xformopt.passes.fewest import fewest_that_pass
from xformopt.passes.int4 import kv_cache
from xformopt.passes.int4.fuse import fused_float
from xformopt.passes.int4.gguf_blocks import AUX, aux_nodes, carry_into, carry_record, gguf_source
from xformopt.passes.int4.harm import harm_scores
from xformopt.passes.quantize import calibration as cal
from xformopt.passes.quantize.formats import agreement_floor
from xformopt.passes.records import Int4Record
from xformopt.passes.stage_runs import stage_runs
from xformopt.runtime.decoder import CacheLayout, OrtDecoder, step_token_limit

Role = Literal["lm_head", "attention_output", "down_proj", "qkv", "mlp_in"]
BLOCK_SIZES = (16, 32, 64, 128, 256)  # weights per scale that MatMulNBits takes


class Int4Options(PassOptions):
    block_size: int = Field(32, description="weights per scale (16, 32, 64, 128 or 256)")
    symmetric: bool = Field(True, description="symmetric blocks (no zero points)")
    accuracy_level: int = Field(4, ge=0, le=4, description="MatMulNBits compute type; 4 = int8 dot products on CPU")
    algorithm: Literal["rtn", "hqq", "gptq"] = Field("rtn", description="rtn, hqq (data-free) or gptq (calibrated)")
    keep_8bit: list[Role] = Field(default_factory=list, description="roles packed at 8 bits (lm_head, attention_output, down_proj, qkv, mlp_in)")
    max_perplexity_increase: float | str | None = Field(
        None, description="budget vs the float graph, relative ('3%' or 0.03); over it, harmful MatMuls go to 8 bits")
    perplexity_texts: int = Field(64, ge=4, description="held-out texts the budget scores (vendored validation split)")
    max_8bit_nodes: int | None = Field(None, ge=0, description="most MatMuls the budget may move to 8 bits; default: half")
    carry_gguf: bool = Field(True, description="a model converted from GGUF keeps the file's own Q4_0/Q4_1/Q8_0 "
                                               "blocks (exact) instead of being quantized again")
    exact_gguf: bool = Field(True, description="carried Q4_1 blocks keep their minimums exactly (a block-sum term "
                                               "beside each MatMul); false: the minimum rounds to a 4-bit zero point "
                                               "(one op per MatMul, weights shift by at most half a step)")
    # Off by default: measured no faster on a quiet Zen 4 (benchmarks/results/decode-fused/), bit-identical output.
    fuse_projections: bool = Field(False, description="MatMuls reading one input (gate/up, q/k/v) packed as one "
                                                      "MatMulNBits (and one Q4_1 minimum term) and split after")
    block_sums: Literal["reduce", "matmul"] = Field(
        "reduce", description="exact Q4_1: each input's 32-block sums by Reshape + ReduceSum, or by one MatMul "
                              "with a shared 0/1 block indicator (one node instead of two)")
    requantize: list[Role] = Field(default_factory=list, description="roles the algorithm quantizes even where the "
                                                                     "GGUF file has blocks (e.g. lm_head at 4 bits)")
    kv_cache: Literal["float", "int8", "auto"] = Field(
        "float", description="the KV cache's type; int8: GroupQueryAttention keeps K and V at 8 bits (per-channel "
                             "scales calibrated on the train split); auto: int8 where the graph has GroupQueryAttention")
    block_sizes: dict[Role, int] | str = Field(
        default_factory=dict, description="block size per role, over block_size ('down_proj=128,lm_head=64'; rtn, hqq)")
    exclude_nodes: list[str] = Field(default_factory=list, description="MatMul node names kept in float")
    min_agreement: float | None = Field(
        None, ge=0, le=1, description="floor on the logits' cosine to the float graph; default: the task's (0.9)")
    calibration_data: str | None = Field(None, description="gptq: calibration texts (same formats as --data); "
                                                           "default: vendored train split")
    calibration_limit: int | None = Field(256, ge=1, description="gptq: calibrate on at most this many rows (seeded sample)")
    budget_data: str | None = Field(None, description="perplexity budget texts; default: vendored validation split")

    @model_validator(mode="before")
    @classmethod
    def _no_accuracy_drop(cls, values):
        if isinstance(values, dict) and values.get("max_accuracy_drop") is not None:
            raise PydanticCustomError("int4_budget", "int4 takes a perplexity budget (max_perplexity_increase, e.g. "
                                                     "'3%'), not max_accuracy_drop")
        return values

    @field_validator("block_size")
    @classmethod
    def _block(cls, value):
        return _checked_block(value, "block_size")

    @field_validator("block_sizes", mode="before")
    @classmethod
    def _blocks(cls, value):
        if isinstance(value, str):  # the command line's 'role=N,role=N'
            pairs = [item.partition("=") for item in value.split(",") if item.strip()]
            if any(not sep or not size.strip().isdigit() for _, sep, size in pairs):
                raise ValueError(f"block_sizes must read 'role=N,role=N' (e.g. 'down_proj=128'), got {value!r}")
            value = {role.strip(): int(size) for role, _, size in pairs}
        return {role: _checked_block(size, f"block_sizes.{role}") for role, size in dict(value).items()}

    @model_validator(mode="after")
    def _blocks_need_a_nodewise_algorithm(self):
        if self.block_sizes and self.algorithm == "gptq":
            raise PydanticCustomError("int4_blocks", "block_sizes works with rtn and hqq (GPTQ quantizes the whole "
                                                     "graph at one block size); drop it or use --algorithm rtn")
        return self

    def block_for(self, role: str | None) -> int:
        return self.block_sizes.get(role, self.block_size)

    @field_validator("max_perplexity_increase", mode="before")
    @classmethod
    def _ppl_budget(cls, value):
        if value is None:
            return None
        text = str(value).strip()
        try:
            fraction = float(text[:-1]) / 100 if text.endswith("%") else float(text)
        except ValueError:
            fraction = -1.0
        if isinstance(value, bool) or not 0 <= fraction < 10:
            raise ValueError(f"max_perplexity_increase must be a relative increase like '3%' or 0.03, got {value!r}")
        return text if text.endswith("%") else fraction


def _checked_block(value: int, name: str) -> int:
    if value not in BLOCK_SIZES:
        raise ValueError(f"{name} must be {', '.join(map(str, BLOCK_SIZES[:-1]))} or {BLOCK_SIZES[-1]}, got {value}")
    return value


def allowed_increase(budget: float | str) -> float:
    return float(budget[:-1]) / 100 if isinstance(budget, str) else float(budget)


def weighted_matmuls(model) -> list[str]:
    """Names of MatMuls whose second input is a 2-D initializer (what MatMulNBits can take), less the
    float helpers of carried Q4_1 blocks (xformopt/passes/int4/gguf_blocks.py)."""
    inits = {i.name: i for i in model.graph.initializer}
    return [n.name for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in inits
            and len(inits[n.input[1]].dims) == 2 and AUX not in n.name]


def nbits_counts(model) -> dict:
    """MatMulNBits by bits, and the accuracy levels the nodes really carry (read back, not assumed)."""
    counts: dict = {"MatMulNBits": 0, "4bit": 0, "8bit": 0}
    levels: set[int] = set()
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            attrs = {a.name: a.i for a in node.attribute}
            counts["MatMulNBits"] += 1
            counts[f"{attrs.get('bits', 4)}bit"] = counts.get(f"{attrs.get('bits', 4)}bit", 0) + 1
            levels.add(attrs.get("accuracy_level", 0))
    counts["accuracy_levels"] = sorted(levels)
    return counts


# --------------------------------------------------------------------------- building a candidate


class DecoderCalibrationReader:
    """GPTQ's calibration feed: real texts, one prompt step each (zero-length past)."""

    def __init__(self, model_path: Path, tokenizer, texts, max_tokens: int = 64):
        import onnxruntime as ort

        session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
        self.layout = CacheLayout.from_session(session)
        self.inputs = {i.name for i in session.get_inputs()}
        max_tokens = min(max_tokens, step_token_limit(self.layout) or max_tokens)  # one graph call each
        self.rows = [list(tokenizer(t)["input_ids"])[:max_tokens] for t in texts]
        self.rows = [r for r in self.rows if r]
        self.rewind()

    def rewind(self):
        self._iter = iter(self.rows)

    def get_next(self):
        ids = next(self._iter, None)
        if ids is None:
            return None
        feed = {"input_ids": np.asarray([ids], dtype=np.int64), "attention_mask": np.ones((1, len(ids)), dtype=np.int64),
                **self.layout.empty_past(1)}
        if "position_ids" in self.inputs:
            feed["position_ids"] = np.arange(len(ids), dtype=np.int64)[None]
        return {k: v for k, v in feed.items() if k in self.inputs}

    def __iter__(self):
        self.rewind()
        while (feed := self.get_next()) is not None:
            yield feed


def _algo_config(options, reader, block: int, bits: int = 4, included_only: bool = False):
    """ORT's quantizer settings; ``included_only``: quantize the quantizer's ``nodes_to_include`` and
    nothing else (no op type matches "__none__")."""
    from onnxruntime.quantization import matmul_nbits_quantizer as mnb

    only = {"op_types_to_quantize": ("__none__",)} if included_only else {}
    if bits == 8 or options.algorithm == "rtn":
        return mnb.DefaultWeightOnlyQuantConfig(block_size=block, is_symmetric=options.symmetric,
                                                accuracy_level=options.accuracy_level, bits=bits, **only)
    if options.algorithm == "hqq":
        return mnb.HQQWeightOnlyQuantConfig(block_size=block, bits=4, **only)
    return mnb.GPTQWeightOnlyQuantConfig(calibration_data_reader=reader, block_size=block)


def _by_block(options, names) -> dict[int, list[str]]:
    """``names`` grouped by the block size their role gets."""
    groups: dict[int, list[str]] = {}
    for name in names:
        groups.setdefault(options.block_for(role_of(name)), []).append(name)
    return groups


def _quantize_nodes(model, options, names: list[str], bits: int, reader=None):
    """``names`` packed at ``bits``, one quantizer run per block size; the model it returns."""
    from onnxruntime.quantization import matmul_nbits_quantizer as mnb

    for block, group in sorted(_by_block(options, names).items()):
        quantizer = mnb.MatMulNBitsQuantizer(model, bits=bits, block_size=block, is_symmetric=options.symmetric,
                                             accuracy_level=options.accuracy_level, nodes_to_include=group,
                                             algo_config=_algo_config(options, reader, block, bits, True))
        with contextlib.redirect_stdout(sys.stderr):
            quantizer.process()
        model = quantizer.model.model
    return model


def build_candidate(src_model: Path, out_model: Path, options, keep8: list[str], reader=None,
                    gguf: Path | None = None, kv_scales: dict | None = None) -> dict:
    """8-bit MatMulNBits for ``keep8`` first (so no algorithm touches them again), then the GGUF
    file's own blocks where ``gguf`` has them (less the ``requantize`` roles), then 4 bits for every
    other weighted MatMul (roles with their own ``block_sizes`` first); saved with external data
    beside ``out_model``; with ``kv_scales``, an int8 KV cache (passes/int4/kv_cache.py)."""
    import onnx
    from onnxruntime.quantization import matmul_nbits_quantizer as mnb

    logging.getLogger("onnxruntime.quantization").setLevel(logging.ERROR)
    model = onnx.load(src_model)
    if keep8:
        model = _quantize_nodes(model, options, list(keep8), bits=8)
    carried, not_carried = [], {}
    if gguf is not None:
        wanted = {n for n in weighted_matmuls(model) if role_of(n) not in options.requantize}
        carried, not_carried = carry_into(model, src_model.parent, gguf, options.accuracy_level, only=wanted,
                                          exact=options.exact_gguf, sums_by=options.block_sums)
    own_block = [n for n in weighted_matmuls(model) if role_of(n) in options.block_sizes]
    if own_block:
        model = _quantize_nodes(model, options, own_block, bits=4, reader=reader)
    four = mnb.MatMulNBitsQuantizer(model, bits=4, block_size=options.block_size, is_symmetric=options.symmetric,
                                    accuracy_level=options.accuracy_level,
                                    algo_config=_algo_config(options, reader, options.block_size),
                                    nodes_to_exclude=aux_nodes(model))
    with contextlib.redirect_stdout(sys.stderr):  # GPTQ prints a progress bar: results own stdout
        four.process()
    model = four.model.model
    _set_accuracy_level(model, options.accuracy_level)
    if kv_scales:
        kv_cache.to_int8(model, kv_scales)
    out_model.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, out_model, save_as_external_data=True, all_tensors_to_one_file=True,
              location=out_model.name + ".data", size_threshold=1024)
    return {**nbits_counts(model), **({"gguf_carried": carried, "gguf_not_carried": not_carried} if gguf else {})}


def _set_accuracy_level(model, level: int) -> None:
    """ORT 1.32's HQQ quantizer writes no ``accuracy_level`` (so its nodes would run the float-compute
    kernel); the attribute only picks the kernel's compute type, so every node gets the asked one."""
    import onnx

    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            kept = [a for a in node.attribute if a.name != "accuracy_level"]
            del node.attribute[:]
            node.attribute.extend([*kept, onnx.helper.make_attribute("accuracy_level", int(level))])


class Int4Pass(Pass):
    name = "int4"
    stage = "onnx"
    consumes = "onnx"
    produces = "onnx"
    Options = Int4Options
    Record = Int4Record
    must_not_follow = {"quantize": "the graph is already quantized (INT8)", "int4": "the graph is already 4-bit"}
    summary = "4-bit weight-only MatMulNBits for decoders (rtn, hqq, gptq), mixed 4/8-bit plan, optional perplexity budget"
    needs = ("calibration texts (gptq; default: vendored train split)",
             "perplexity texts (with max_perplexity_increase; default: vendored validation split)")
    flags = {"calibration_data": "calibration_data", "validation_data": "budget_data", "min_agreement": "min_agreement"}
    data_options = ("calibration_data", "budget_data")
    read_when = {"calibration_data": "with algorithm gptq", "budget_data": "with a perplexity budget (max_perplexity_increase)"}

    @classmethod
    def reads(cls, option: str, options: dict) -> bool:
        if option == "calibration_data":
            return options.get("algorithm") == "gptq"
        if option == "budget_data":
            return options.get("max_perplexity_increase") is not None
        return True

    @staticmethod
    def report_facts(record: dict) -> dict:
        return {"matmulnbits": record["matmulnbits"], "weighted_gemms": record["weighted_matmuls"],
                "float_gemms": [g["name"] for g in record["kept_float"]]}

    @staticmethod
    def budget_failure(record: dict, out: Path) -> str:
        b = record.get("budget", {})
        return (f"perplexity budget not met: {b['float_perplexity']:.3f} -> {b['perplexity_after']:.3f} "
                f"({b['increase']:+.2%} > {b['allowed_increase']:.2%}) with up to {b['max_extra_8bit']} MatMul(s) at 8 bits; "
                f"the best candidate was written to {out} (raise max_8bit_nodes, keep more roles at 8 bits, or loosen the budget)")

    @staticmethod
    def summarize(rec: dict) -> str:
        return summarize_int4(rec)

    def run(self, ctx: PassContext, src: Path, dst: Path, options: Int4Options) -> Int4Record:
        return run_int4(ctx, src, dst, options)


def _checked_input(ctx, src: Path, options: Int4Options) -> tuple[list[str], bool]:
    """(the weighted MatMuls to pack, whether the KV cache becomes int8); bad input refused before any work."""
    import onnx

    graph = onnx.load(src / "model.onnx", load_external_data=False)
    if any(n.op_type == "MatMulNBits" for n in graph.graph.node):
        raise InputError(f"{src} is already 4-bit (it has MatMulNBits); quantize its float input instead")
    candidates = weighted_matmuls(graph)
    if not candidates:
        raise InputError(f"{src / 'model.onnx'} has no MatMul with a constant 2-D weight for MatMulNBits to pack")
    if options.algorithm == "gptq" and not options.symmetric:
        _check_gptq_blocks(graph, candidates, options.block_size)
    has_gqa = bool(kv_cache.gqa_nodes(graph))
    if options.kv_cache == "int8" and not has_gqa:
        raise InputError(f"{src} has no GroupQueryAttention, so kv_cache int8 has no cache op to give it to; export "
                         "the decoder with the genai extra (pip install 'xformopt[genai]') or drop kv_cache")
    if options.kv_cache == "auto" and not has_gqa:
        ctx.log("kv_cache auto: no GroupQueryAttention in the graph, the KV cache stays float")
    return candidates, options.kv_cache != "float" and has_gqa


def _check_gptq_blocks(graph, candidates: list[str], block: int) -> None:
    """ORT's GPTQ packs asymmetric zero points two to a byte across each weight's blocks and fails mid-run
    (a reshape) when a weight has an odd number of blocks (SmolLM2's 576 inputs at block 64 or 128); refused
    here, before any work, with the block sizes that fit. Symmetric GPTQ stores no zero points."""
    inits, wanted = {i.name: i for i in graph.graph.initializer}, set(candidates)
    sizes = {int(inits[n.input[1]].dims[0]) for n in graph.graph.node if n.name in wanted}

    def odd_blocks(k: int, b: int) -> bool:
        return -(-k // b) % 2 == 1  # ceil(k / b) is odd

    odd = sorted(k for k in sizes if odd_blocks(k, block))
    if odd:
        fits = [b for b in BLOCK_SIZES if not any(odd_blocks(k, b) for k in sizes)]
        raise InputError(f"asymmetric gptq needs an even number of blocks per weight; block_size {block} gives an odd "
                         f"number for input size {', '.join(map(str, odd))}: use block_size "
                         f"{' or '.join(map(str, fits)) or '16'}, --symmetric, or algorithm rtn/hqq")


def run_int4(ctx, src: Path, dst: Path, options: Int4Options) -> dict:
    import onnx

    candidates, int8_kv = _checked_input(ctx, src, options)
    tokenizer = load_tokenizer(src, ctx.spec.trust_remote_code)

    reader, calibration = None, None
    if options.algorithm == "gptq":
        dataset = cal.load_split(options.calibration_data, "train", ctx.spec, options.calibration_limit, 0, labels=False)
        reader = DecoderCalibrationReader(src / "model.onnx", tokenizer, dataset.texts)
        calibration = cal.dataset_record(dataset, "calibration")
        ctx.log(f"GPTQ calibration on {len(dataset)} rows from {dataset.source}")

    kv_scales, kv_record = _kv_scales(ctx, options, src, tokenizer) if int8_kv else (None, None)
    gguf, record_gguf = gguf_source(ctx, src, options.carry_gguf)
    copy_stage(src, dst, with_model=False)
    work = dst / ".int4"
    work.mkdir()
    float_model, fused = src / "model.onnx", None
    if options.fuse_projections:
        float_model, fused = fused_float(ctx, src, work, gguf, set(options.exclude_nodes))
        candidates = weighted_matmuls(onnx.load(float_model, load_external_data=False))
    roles = {name: role_of(name) for name in candidates}
    planned8 = [n for n in candidates if roles[n] in options.keep_8bit and n not in options.exclude_nodes]
    record: dict = {
        "mode": "int4", "algorithm": options.algorithm, "block_size": options.block_size,
        "symmetric": options.symmetric if options.algorithm != "hqq" else False,  # HQQ always writes zero points
        "accuracy_level": options.accuracy_level, "weighted_matmuls": len(candidates),
        **({"block_sizes": dict(options.block_sizes)} if options.block_sizes else {}),
        **({"requantize": list(options.requantize)} if options.requantize else {}),
        **({"calibration": calibration} if calibration else {}),
        **({"kv_cache": kv_record} if kv_record else {}),
        **({"fused_projections": fused} if fused else {}),
    }
    try:
        def build(k_dir: Path, keep8: list[str]) -> dict:
            started = time.perf_counter()
            counts = build_candidate(float_model, k_dir / "model.onnx", options, keep8, reader, gguf,
                                     kv_scales)
            return {**counts, "build_seconds": round(time.perf_counter() - started, 2)}

        ctx.log(f"quantizing to 4-bit MatMulNBits ({options.algorithm}, block {options.block_size}, "
                f"{'symmetric' if options.symmetric else 'asymmetric'}, accuracy_level {options.accuracy_level}); "
                f"{len(planned8)} MatMul(s) at 8 bits by plan {options.keep_8bit or '[]'}")
        first = work / "candidate-0"
        counts = build(first, planned8)
        if record_gguf is not None:
            record["gguf"] = (carry_record(ctx, record_gguf, counts, candidates, options.exact_gguf) if gguf
                                  else record_gguf)
        chosen_dir, chosen8 = first, planned8
        if options.max_perplexity_increase is not None:
            chosen_dir, chosen8, record["budget"] = _budget(ctx, options, src, work, build, candidates, planned8, tokenizer,
                                                            counts, float_model)
            record["budget_met"] = record["budget"]["budget_met"]
        for item in chosen_dir.iterdir():
            shutil.move(str(item), dst / item.name)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    after = onnx.load(dst / "model.onnx", load_external_data=False)
    nbits = nbits_counts(after)
    if nbits["4bit"] == 0:
        raise PassFailed(f"quantize int4 changed nothing: none of {len(candidates)} weighted MatMuls became 4-bit MatMulNBits")
    left = weighted_matmuls(after)
    record["matmulnbits"] = nbits
    if fused:
        fused["graph_nodes"] = len(after.graph.node)  # the packed graph's, Q4_1 minimum terms included
    record["int8_matmuls"] = [{"name": n, "role": roles[n], "why": "plan" if n in planned8 else "budget"} for n in chosen8]
    record["kept_float"] = [{"name": n, "role": roles.get(n)} for n in left]
    record["size_bytes"] = {"before": _size(src), "after": _size(dst)}
    ctx.log(f"int4: {nbits['4bit']} MatMulNBits at 4 bits, {nbits['8bit']} at 8 bits, {len(left)} weighted MatMul(s) "
            f"float; {record['size_bytes']['before'] / 1e6:.1f} -> {record['size_bytes']['after'] / 1e6:.1f} MB")
    agreement = stage_runs(ctx.spec).agreement(ctx, src, dst)
    record["agreement"] = agreement
    floor = agreement_floor(ctx.spec.task_def, options.min_agreement)
    if agreement["mean_agreement"] < floor and record.get("budget_met", True):
        raise PassFailed(f"int4 logits disagree with float: mean {agreement['measure']} {agreement['mean_agreement']:.3f} < {floor}")
    return record


def _kv_scales(ctx, options, src: Path, tokenizer) -> tuple[dict, dict]:
    """Per-channel int8 scales of every layer's K and V, from the float graph on the train split (the
    calibration rows GPTQ would take, never the budget's or the report's)."""
    dataset = cal.load_split(options.calibration_data, "train", ctx.spec, options.calibration_limit, 0, labels=False)
    lists = token_lists(dataset.texts, tokenizer, context_window(src), 128)
    ctx.log(f"int8 KV cache: calibrating per-channel scales on {len(lists)} texts from {dataset.source}")
    scales = kv_cache.calibrate(src, lists, ctx.threads)
    record = {"type": "int8", "scales": "per channel (kv_heads x head_dim), peak |value| / 127 over calibration",
              "caches": len(scales), "calibration": cal.dataset_record(dataset, "calibration")}
    return scales, record


def _size(stage: Path) -> int:
    return sum(p.stat().st_size for p in stage.glob("model.onnx*"))


def _budget(ctx, options, src: Path, work: Path, build, candidates: list[str], planned8: list[str], tokenizer,
            first_counts: dict, float_model: Path):
    """Fewest 4-bit MatMuls returned to 8 bits, most harmful first, that meet the perplexity budget."""
    dataset = cal.load_split(options.budget_data, "validation", ctx.spec, options.perplexity_texts, 0, labels=False)
    lists = token_lists(dataset.texts, tokenizer, context_window(src), 128)
    float_ppl = perplexity(OrtDecoder(src, threads=ctx.threads), lists)["value"]
    allowed = allowed_increase(options.max_perplexity_increase)
    ctx.log(f"perplexity budget: float graph {float_ppl:.3f} on {len(lists)} texts ({dataset.source}); "
            f"allowed increase {allowed:.1%}")
    four = [n for n in candidates if n not in planned8 and n not in options.exclude_nodes]
    max8 = len(four) // 2 if options.max_8bit_nodes is None else min(options.max_8bit_nodes, len(four))
    tried: list[dict] = []
    dirs: dict[int, Path] = {}

    def attempt(k: int, ranked: list[str], counts: dict | None = None) -> dict:
        out = work / f"candidate-{k}"
        if counts is None:
            counts = build(out, [*planned8, *ranked[:k]])
        started = time.perf_counter()
        value = perplexity(OrtDecoder(out, threads=ctx.threads), lists)["value"]
        increase = value / float_ppl - 1
        row = {"extra_8bit": k, "moved_to_8bit": ranked[:k], "perplexity": round(value, 4),
               "increase": round(increase, 5), "passes": increase <= allowed + 1e-12,
               "build_seconds": counts["build_seconds"], "eval_seconds": round(time.perf_counter() - started, 2)}
        ctx.log(f"budget candidate with {k} extra 8-bit MatMul(s): perplexity {value:.3f} ({increase:+.2%}, "
                f"{'within' if row['passes'] else 'over'} budget)")
        tried.append(row)
        dirs[k] = out
        return row

    ranking: list[dict] = []
    ranked: list[str] = []
    row = attempt(0, ranked, first_counts)
    if not row["passes"] and max8 > 0:
        started = time.perf_counter()
        scores = harm_scores(float_model, four, lists, options, work)
        ranking = [{"name": n, "role": role_of(n), "harm": round(h, 6)} for n, h in sorted(scores.items(), key=lambda kv: -kv[1])]
        ranked = [r["name"] for r in ranking]
        ctx.log(f"ranked {len(ranked)} 4-bit MatMuls by harm in {time.perf_counter() - started:.1f}s; most harmful: "
                + ", ".join(f"{r['name']} ({r['harm']:.4f})" for r in ranking[:3]))
        fewest_that_pass(lambda k: attempt(k, ranked)["passes"], max8)
    passing = [r for r in tried if r["passes"]]
    best = min(passing, key=lambda r: r["extra_8bit"]) if passing else min(tried, key=lambda r: (r["increase"], r["extra_8bit"]))
    reason = ("fewest extra 8-bit MatMuls within budget" if passing
              else f"no candidate within budget (up to {max8} extra 8-bit MatMuls); wrote the smallest increase")
    ctx.log(f"perplexity budget {'met' if passing else 'NOT met'}: {best['perplexity']:.3f} ({best['increase']:+.2%}), "
            f"{best['extra_8bit']} MatMul(s) moved to 8 bits; {reason}")
    budget = {
        "budget_met": bool(passing), "max_perplexity_increase": options.max_perplexity_increase,
        "allowed_increase": allowed, "float_perplexity": round(float_ppl, 4), "perplexity_after": best["perplexity"],
        "increase": best["increase"], "data": {**cal.dataset_record(dataset, "budget"), "texts_scored": len(lists)},
        "max_extra_8bit": max8, "harm_ranking": ranking, "search": tried, "chosen": best["extra_8bit"], "reason": reason,
        "harm_measure": "relative output error of simulated 4-bit RTN weights on the float graph's activations",
    }
    return dirs[best["extra_8bit"]], [*planned8, *best["moved_to_8bit"]], budget


def summarize_int4(rec: dict) -> str:
    """One line for an int4 record: MatMuls at 4 and 8 bits, agreement, the perplexity budget."""
    n = rec["matmulnbits"]
    line = (f"int4 {rec['algorithm']} (block {rec['block_size']}, accuracy_level {rec['accuracy_level']}): "
            f"{n['4bit']}/{rec['weighted_matmuls']} MatMuls 4-bit, {n['8bit']} 8-bit MatMulNBits, "
            f"{len(rec['kept_float'])} float; logits {rec['agreement']['measure']} vs float {rec['agreement']['mean_agreement']:.4f}")
    if rec.get("gguf"):
        g = rec["gguf"]
        line += (f"; {g['carried']} carried exactly from GGUF {g.get('file_type') or ''} "
                 f"({', '.join(f'{n} {t}' for t, n in g['carried_by_type'].items())})")
    if rec.get("fused_projections", {}).get("used"):
        f = rec["fused_projections"]
        line += f"; {f['matmuls_fused']} same-input MatMuls packed as {f['groups']}"
    if "budget" in rec:
        b = rec["budget"]
        line += (f"; perplexity budget {'met' if b['budget_met'] else 'NOT met'}: {b['float_perplexity']:.3f} -> "
                 f"{b['perplexity_after']:.3f} ({b['increase']:+.2%}), {b['chosen']} moved to 8 bits")
    return line
