"""The export pass for encoder-decoder models: two graphs written, configs copied, parity verified."""

from __future__ import annotations

import shutil
from pathlib import Path

from xformopt.errors import PassFailed
from xformopt.measure import memory
from xformopt.models import load_tokenizer
from xformopt.models.quiet import load_quietly, quiet_loggers
from xformopt.seq2seq import GRAPH_FILES
from xformopt.seq2seq.export import export_seq2seq
from xformopt.seq2seq.parity import check_parity
from xformopt.seq2seq.runner import OrtSeq2Seq, TorchSeq2Seq
from xformopt.seq2seq.search_graph import CHECK_ROWS, write_search_graph

DYNAMO_MIN_OPSET = 18
# Small files a seq2seq stage carries beside its graphs (config, generation defaults, tokenizer).
CONFIG_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                "special_tokens_map.json", "spiece.model", "source.spm", "target.spm", "vocab.json",
                "sentencepiece.bpe.model", "merges.txt", "added_tokens.json")


def copy_config_files(src: Path, dst: Path) -> None:
    for name in CONFIG_FILES:
        if (src / name).is_file() and not (dst / name).exists():
            shutil.copy2(src / name, dst / name)


def graph_record(dst: Path) -> dict:
    """Inputs, outputs, node counts and dynamic axes of both graphs."""
    import onnx

    out = {}
    for name in GRAPH_FILES:
        graph = onnx.load(dst / name, load_external_data=False).graph
        out[name] = {"inputs": [i.name for i in graph.input], "outputs": [o.name for o in graph.output],
                     "nodes": len(graph.node),
                     "dynamic_axes": {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]
                                      for i in graph.input}}
    return out


def export_seq2seq_stage(ctx, src: Path, dst: Path, options) -> dict:
    """``ctx``: the pass context (spec, sample texts, threads); ``options``: export's options."""
    import torch
    from transformers import AutoModelForSeq2SeqLM

    opset = max(options.opset, DYNAMO_MIN_OPSET)
    ctx.log(f"exporting {ctx.spec.model_type} ({ctx.spec.task}): encoder + cached decoder with "
            f"torch.onnx.export(dynamo=True) at opset {opset}")
    dst.mkdir(parents=True, exist_ok=True)
    model = load_quietly(AutoModelForSeq2SeqLM.from_pretrained, src, trust_remote_code=ctx.spec.trust_remote_code).eval()
    if ctx.threads:
        torch.set_num_threads(ctx.threads)
    with quiet_loggers("torch.onnx", "torch.export", "onnxscript", "transformers"):
        names = export_seq2seq(model, dst, opset)
    copy_config_files(src, dst)
    ctx.log("checking parity against PyTorch: encoder states, first step and cached steps")
    tokenizer = load_tokenizer(src, ctx.spec.trust_remote_code)
    parity = check_parity(TorchSeq2Seq(model=model), OrtSeq2Seq(dst, threads=ctx.threads), tokenizer,
                          list(ctx.sample_texts))
    del model
    memory.release()
    if parity["max_abs_diff"] > options.max_abs_diff or parity["min_cosine"] < options.min_cosine:
        raise PassFailed(
            f"seq2seq export parity failed: max |diff| {parity['max_abs_diff']:.2e} (limit {options.max_abs_diff:.0e}), "
            f"min cosine {parity['min_cosine']:.6f} (limit {options.min_cosine}) at source lengths "
            f"{parity['sequence_lengths']} ({parity['max_abs_diff_by_output']})")
    search = write_search_graph(dst, list(ctx.sample_texts)[:CHECK_ROWS], tokenizer, ctx.threads)
    return {"exporter": "torch.onnx.export (dynamo=True): encoder (+ cross-attention cache, first step) and a cached "
                        "decoder step", "opset": opset, "task": ctx.spec.task, "graphs": graph_record(dst),
            "past_inputs": 4 * names["layers"], "inputs": names["encoder"]["inputs"] + names["decoder"]["inputs"],
            "outputs": names["decoder"]["outputs"], "parity": parity, "search_graph": search}
