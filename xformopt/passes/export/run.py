"""export: PyTorch -> ONNX, with dynamic batch and sequence axes, verified against PyTorch.

Encoders go through torch's dynamo exporter (``torch.onnx.export(dynamo=True)``), the exporter
transformers and torch maintain; its graphs reach ONNX Runtime's fused kernels through onnxscript's ORT
fusion rewriter in ``fuse`` (xformopt/passes/export/dynamo.py). ``exporter: torchscript`` traces with
the TorchScript exporter over eager attention instead, for a model torch.export cannot trace. Decoders
go through their KV-cache exporters (xformopt/passes/export/decoder.py).
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path
from typing import Literal

from pydantic import Field

from xformopt.artifact import copy_sentence_transformers_modules
from xformopt.errors import InputError, PassFailed
from xformopt.exporting import compare, spread_by_length
from xformopt.families import genai_builder_available
from xformopt.measure import memory
from xformopt.models import load_torch_model
from xformopt.models.quiet import quiet_loggers
from xformopt.passes.base import Pass, PassContext, PassOptions
from xformopt.passes.export.decoder import export_decoder
from xformopt.passes.export.dynamo import DYNAMO, export_encoder, require_onnxscript
from xformopt.passes.records import ExportRecord
from xformopt.runtime.encoder import OrtPredictor, TorchPredictor
from xformopt.seq2seq.stage import export_seq2seq_stage


class ExportOptions(PassOptions):
    opset: int = Field(18, ge=14, le=23, description="ONNX opset (the dynamo exporter writes 18 or newer)")
    max_abs_diff: float = Field(1e-3, gt=0, description="parity: largest |onnx - torch| allowed")
    min_cosine: float = Field(0.9999, gt=0, le=1, description="parity: smallest per-row cosine allowed")
    exporter: Literal["torchscript", "dynamo"] | None = Field(
        None, description="dynamo: torch.onnx.export(dynamo=True), fused by onnxscript's rewriter in `fuse`; "
        "torchscript: torch's TorchScript tracer over eager attention (for a model torch.export cannot trace); "
        "default: the family's (dynamo)")


def check_parity(ctx: PassContext, model_dir: Path, onnx_dir: Path, options: ExportOptions) -> dict:
    """ONNX against PyTorch on real rows as the model receives them (``Task.model_inputs``: a question
    with its context, a context with its choices), chosen to span their encoded lengths, each at batch
    1, then a padded batch of 2."""
    torch_model = TorchPredictor(ctx.spec, model_dir, threads=ctx.threads)
    texts, pairs = ctx.spec.task_def.model_inputs(ctx.sample_data)

    tokenize = torch_model.tokenize

    def encode(rows: list[int]) -> dict:
        return tokenize([texts[i] for i in rows], None if pairs is None else [pairs[i] for i in rows])

    lengths = [int(encode([i])["input_ids"].shape[-1]) for i in range(len(texts))]
    picked = spread_by_length(lengths, what="texts" if pairs is None else "pairs")
    cases = [[i] for i in picked] + [picked[:2]]  # each length at batch 1, then a padded batch of 2
    encodings = [encode(rows) for rows in cases]
    expected = [torch_model.raw_outputs(encoded) for encoded in encodings]
    paired = [pair_tokens(torch_model, texts[i], lengths[i]) for i in picked] if pairs is not None else None
    del torch_model  # the PyTorch weights and ORT's copy of them need not be resident together
    memory.release()
    onnx_model = OrtPredictor(ctx.spec, onnx_dir, threads=ctx.threads)
    worst = {"max_abs_diff": 0.0, "min_cosine": 1.0}
    checked = []
    for encoded, reference in zip(encodings, expected):
        checked.append(int(encoded["input_ids"].shape[-1]))
        got = compare(reference, onnx_model.raw_outputs(encoded), encoded["attention_mask"])
        worst["max_abs_diff"] = max(worst["max_abs_diff"], got["max_abs_diff"])
        worst["min_cosine"] = min(worst["min_cosine"], got["min_cosine"])
    result = {**worst, "sequence_lengths": checked, "batch_sizes": [len(b) for b in cases]}
    if paired is not None:
        result["pair_lengths"] = paired
    where = f"lengths {checked}" + (f" (text + pair tokens {result['pair_lengths']})" if pairs is not None else "")
    if worst["max_abs_diff"] > options.max_abs_diff or worst["min_cosine"] < options.min_cosine:
        raise PassFailed(
            f"export parity failed: max |diff| {worst['max_abs_diff']:.2e} (limit {options.max_abs_diff:.0e}), "
            f"min cosine {worst['min_cosine']:.6f} (limit {options.min_cosine}) at {where}"
        )
    return result


def pair_tokens(predictor, text: str, encoded: int) -> list[int]:
    """[tokens of the text, tokens of its pair] as encoded together (``encoded``: the pair's length with
    special tokens); the pair's share is what the text alone leaves of it (truncation included)."""
    tokenizer = predictor.tokenizer
    single, pair = tokenizer.num_special_tokens_to_add(pair=False), tokenizer.num_special_tokens_to_add(pair=True)
    alone = int(predictor.tokenize([text])["input_ids"].shape[-1])
    return [alone - single, encoded - alone - (pair - single)]


class ExportPass(Pass):
    name = "export"
    stage = "torch"  # the bridge: it reads a torch stage and writes the first ONNX stage
    depends_on = ("texts",)  # parity texts only: it times nothing
    consumes = "hf"
    produces = "onnx"
    Options = ExportOptions
    Record = ExportRecord
    summary = "PyTorch -> ONNX (dynamic batch/sequence axes), parity-checked against PyTorch"
    needs = ("held-out texts (parity)",)

    @staticmethod
    def report_facts(record: dict) -> dict:
        # decoders whose exporter fuses (onnxruntime-genai's builder) record their fused ops
        return {"fused_ops": record["fused"]} if "fused" in record else {}

    @staticmethod
    def summarize(rec: dict) -> str:
        """One line: what the pass changed and how it was verified."""
        p = rec["parity"]
        pairs = f" (text + pair tokens {p['pair_lengths']})" if "pair_lengths" in p else ""
        return (f"opset {rec['opset']}, parity max|diff| {p['max_abs_diff']:.1e}, min cosine {p['min_cosine']:.6f} "
                f"at lengths {p['sequence_lengths']}{pairs}")

    @classmethod
    def cache_facts(cls, spec, options: dict) -> dict:
        # The exporter the family's row (or, for a decoder, the installed genai builder) picks when the
        # recipe leaves `exporter` unset: a changed default must not reuse a graph the old one wrote.
        family = spec.family
        facts = {"route": family.export_route(options.get("exporter"))}
        if family.exporter == "genai":
            facts["genai_builder"] = genai_builder_available()
        return facts

    def run(self, ctx: PassContext, src: Path, dst: Path, options: ExportOptions) -> ExportRecord:
        # A decoder's KV-cache exporter (parity at every step), else the encoder route the recipe or the
        # family's row asks for.
        route = ctx.spec.family.export_route(options.exporter)
        if ctx.spec.family.decoder:
            return export_decoder(ctx, src, dst, options)
        if route == "seq2seq":  # encoder-decoders: an encoder graph and a cached decoder graph
            return export_seq2seq_stage(ctx, src, dst, options)
        return _export_encoder(ctx, src, dst, options, route)


DYNAMO_MIN_OPSET = 18  # the dynamo exporter's own opset: lower ones are converted down after export
EXPORTER_NAMES = {DYNAMO: "torch.onnx.export (dynamo=True); attention fuses in `fuse` (onnxscript ort_fusions)",
                  "torchscript": "torch.onnx.export (TorchScript tracer, eager attention)"}


def _export_encoder(ctx: PassContext, src: Path, dst: Path, options: ExportOptions, exporter: str) -> dict:
    if exporter == DYNAMO:
        require_onnxscript()  # before loading the model: a missing package fails in a second
    opset = max(options.opset, DYNAMO_MIN_OPSET) if exporter == DYNAMO else options.opset
    ctx.log(f"exporting {ctx.spec.model_type} ({ctx.spec.task}) with torch.onnx.export "
            f"({'dynamo=True' if exporter == DYNAMO else 'TorchScript'}) at opset {opset}")
    # The TorchScript tracer records the ops actually run: eager attention is the explicit MatMul/Softmax
    # graph ORT's fusions match (SDPA would trace to one opaque op).
    model = load_torch_model(ctx.spec, src, **({} if exporter == DYNAMO else {"attn_implementation": "eager"}))
    dst.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings(), quiet_loggers("torch.onnx", "torch.export", "onnxscript", "transformers"):
        warnings.simplefilter("ignore")
        try:
            export_encoder(model, ctx.spec.task_def, dst / "model.onnx", opset, exporter)
        except InputError:
            raise
        except Exception as exc:  # torch.export's errors run to pages: the first line names the construct
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            other = "torchscript" if exporter == DYNAMO else "dynamo"
            raise PassFailed(f"{exporter} export of {ctx.spec.model_type} failed ({type(exc).__name__}: {first[:300]}); "
                             f"try `--exporter {other}` (recipe: export: {{exporter: {other}}})") from exc
    model.config.save_pretrained(dst)
    _keep_only_config_files(src, dst)
    del model
    memory.release()
    ctx.log("checking parity against PyTorch")
    parity = check_parity(ctx, src, dst, options)
    return _record(EXPORTER_NAMES[exporter], opset, dst, parity)


def _record(exporter: str, opset: int, dst: Path, parity: dict) -> dict:
    import onnx

    graph = onnx.load(dst / "model.onnx", load_external_data=False).graph
    return {
        "exporter": exporter,
        "opset": opset,
        "inputs": [i.name for i in graph.input],
        "outputs": [o.name for o in graph.output],
        "nodes": len(graph.node),
        "dynamic_axes": {i.name: [d.dim_param for d in i.type.tensor_type.shape.dim] for i in graph.input},
        "parity": parity,
    }


def _keep_only_config_files(src: Path, dst: Path) -> None:
    """Make sure the ONNX stage carries the config, tokenizer and sentence-transformers module files
    loaders need."""
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        if (src / name).is_file() and not (dst / name).exists():
            shutil.copy2(src / name, dst / name)
    copy_sentence_transformers_modules(src, dst)
