"""Export a decoder with its KV cache: one graph for the prompt step and every cached step.

Dynamic axes: batch, sequence (new tokens this step), past length and total length. Step 0 feeds a
zero-length past; see :mod:`xformopt.decoder`.

**GPT-2** is exported by :func:`export_gpt2` in ONNX Runtime's GPT-2 cache layout (``past_{i}`` of
shape ``(2, batch, heads, past, head_dim)``, an additive ``attention_mask`` of ones and zeros, and
``position_ids``), because that is the graph ORT's GPT-2 ``Attention`` fusion recognizes: each layer
becomes one ``Attention`` node with ``past``/``present``, which ``quantize`` then turns into
``QAttention``. Neither library does this today, which is why it is hand-written here:

- optimum's exporter (``text-generation-with-past``) wrote separate key/value caches and
  transformers 4.57's mask code, and ORT 1.32's GPT-2 fusion matched neither (measured: 0 of 2
  Attention nodes fused on a tiny GPT-2, eager or SDPA attention);
- ORT's own GPT-2 exporter (``onnxruntime.transformers.models.gpt2.gpt2_helper``) cannot trace
  transformers 4.57 or 5 (its vmap-based mask functions fail under the TorchScript tracer);
- the dynamo path (:mod:`.decoder_dynamo`) exports a tiny GPT-2 with parity, and onnxscript fuses its
  attention into MultiHeadAttention, but the rewritten graph does not load in ORT 1.32 (a Gemm left
  with a rank-3 input; transformers 5.23, onnxscript 0.7.2), and ORT's GPT-2 ``Attention`` (which
  ``quantize`` turns into ``QAttention``) is not what it fuses into anyway. So GPT-2 stays here.

The wrapper (:class:`_StackedPastGPT2`) builds the additive mask the way GPT-2 did before
transformers' mask refactor (``(1 - mask) * -10000``), passes a 4-D mask so transformers uses it as
is, and registers an attention function that is transformers 4.57's GPT-2 ``eager_attention_forward``
minus one no-op ``Slice`` of the mask (it cuts the mask to the key length, which it already has),
because that Slice hides the mask from ORT's pattern matcher. transformers 5 dropped GPT-2's causal
``bias`` buffer (causality moved into the mask); :func:`_add_causal_buffers` puts it back, since the
``Where`` on a slice of it is what ORT's fusion matches.

**Llama, Qwen2/3, Mistral, Phi-3** go through onnxruntime-genai's model builder (GroupQueryAttention).
**Every other causal LM** (families the builder does not know, a model_type the family table does not
know, or a builder family without the genai extra) goes through torch's dynamo exporter with its
attention written as GroupQueryAttention (:mod:`.decoder_gqa`, the builder's layout); where that is
refused (linear-attention states, shared key/values: Qwen3.5) through the plain dynamo export
(:mod:`.decoder_dynamo`, split ``past_key_values.{i}.key/value`` layout with ``position_ids``). ``fuse``
then runs onnxscript's ORT fusions on either.

Every export is checked against PyTorch at every step of a multi-step greedy decode (prompts of
several lengths, so several past lengths) and on a left-padded batch of two.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

from xformopt import families
from xformopt.decoder.fusion import attention_record
from xformopt.decoder.generate import context_window
from xformopt.errors import PassFailed
from xformopt.exporting import parity_texts
from xformopt.families import FAMILIES, GENAI_EXTRA
from xformopt.models import load_tokenizer
from xformopt.models.cache_names import cache_kwargs, output_cache
from xformopt.models.quiet import load_quietly, quiet_loggers
from xformopt.onnx_graph import fused_counts
from xformopt.passes.export.decoder_dynamo import export_dynamo_decoder
from xformopt.passes.export.decoder_gqa import NotGroupQueryAttention, export_gqa_decoder
from xformopt.runtime.decoder import OrtDecoder, TorchDecoder
from xformopt.scoring.metrics import row_cosine

_log = logging.getLogger(__name__)

# Small files a decoder stage carries beside model.onnx (config, generation defaults, tokenizer).
CONFIG_FILES = (
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "vocab.json", "merges.txt", "added_tokens.json", "tokenizer.model", "vocab.txt",
    "chat_template.jinja", "chat_template.json",  # transformers >= 4.43 saves the chat template apart
    "gguf_source.json",  # the GGUF file a checkpoint was converted from (xformopt/sources/gguf.py)
)

GPT2_ATTENTION = "xformopt_gpt2_ort"
PARITY_STEPS = 8


def copy_config_files(src: Path, dst: Path) -> None:
    for name in CONFIG_FILES:
        if (src / name).is_file() and not (dst / name).exists():
            shutil.copy2(src / name, dst / name)


# --------------------------------------------------------------------------- GPT-2, ORT layout


def _gpt2_attention(module, query, key, value, attention_mask, head_mask=None, **kwargs):
    """transformers 4.57's GPT-2 eager attention (``modeling_gpt2.eager_attention_forward``) without the
    ``attention_mask[:, :, :, :key_len]`` slice: our mask is built at the key length already. The causal
    part is the ``where`` on a lower-triangular buffer that ORT's GPT-2 fusion matches (transformers 5
    dropped that buffer and folds causality into the mask; :func:`_add_causal_buffers` puts it back)."""
    import torch

    weights = torch.matmul(query, key.transpose(-1, -2))
    if module.scale_attn_weights:
        weights = weights / torch.full([], value.size(-1) ** 0.5, dtype=weights.dtype, device=weights.device)
    if module.scale_attn_by_inverse_layer_idx:
        weights = weights / float(module.layer_idx + 1)
    query_length, key_length = query.size(-2), key.size(-2)
    causal = module.bias[:, :, key_length - query_length : key_length, :key_length]
    floor = torch.full([], torch.finfo(weights.dtype).min, dtype=weights.dtype, device=weights.device)
    weights = torch.where(causal, weights, floor)
    if attention_mask is not None:
        weights = weights + attention_mask
    weights = torch.nn.functional.softmax(weights, dim=-1).type(value.dtype)
    if head_mask is not None:
        weights = weights * head_mask
    return torch.matmul(weights, value).transpose(1, 2), weights


def _add_causal_buffers(model) -> None:
    """The ``bias`` buffer GPT-2 carried before transformers 5: tril(ones(n_positions)), 1x1xNxN bool."""
    import torch

    size = model.config.n_positions
    causal = torch.tril(torch.ones((size, size), dtype=torch.bool)).view(1, 1, size, size)
    for block in model.transformer.h:
        if not hasattr(block.attn, "bias"):
            block.attn.register_buffer("bias", causal, persistent=False)


def _register_gpt2_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(GPT2_ATTENTION, _gpt2_attention)
    AttentionMaskInterface.register(GPT2_ATTENTION, eager_mask)  # unused (4-D masks pass through), but looked up


def _stacked_wrapper(model):
    import torch
    from transformers import DynamicCache

    class _StackedPastGPT2(torch.nn.Module):
        """(input_ids, position_ids, attention_mask, *past_i) -> (logits, *present_i), ORT's GPT-2 layout."""

        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, position_ids, attention_mask, *past):
            additive = (1.0 - attention_mask.to(torch.float32)[:, None, None, :]) * -10000.0
            cache = DynamicCache()
            for layer, stacked in enumerate(past):
                cache.update(stacked[0], stacked[1], layer)
            out = self.model(input_ids=input_ids, position_ids=position_ids, attention_mask=additive,
                             **cache_kwargs(self.model, cache), use_cache=True)
            presents = tuple(torch.cat((layer.keys.unsqueeze(0), layer.values.unsqueeze(0)), dim=0)
                             for layer in output_cache(out).layers)
            return (out.logits, *presents)

    return _StackedPastGPT2(model).eval()


def export_gpt2(src: Path, dst: Path, opset: int, trust_remote_code: bool = False) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    _register_gpt2_attention()
    model = load_quietly(AutoModelForCausalLM.from_pretrained, src, attn_implementation=GPT2_ATTENTION,
                                                 trust_remote_code=trust_remote_code).eval()
    _add_causal_buffers(model)
    config = model.config
    layers, heads = config.n_layer, config.n_head
    head_dim = config.n_embd // heads
    # Trace with a non-empty past (1) and 2 new tokens so no shape is specialised to 0 or 1.
    batch, new, past_len = 1, 2, 1
    ids = torch.zeros((batch, new), dtype=torch.int64)
    positions = torch.arange(past_len, past_len + new, dtype=torch.int64)[None]
    mask = torch.ones((batch, past_len + new), dtype=torch.int64)
    past = [torch.zeros((2, batch, heads, past_len, head_dim)) for _ in range(layers)]
    past_names = [f"past_{i}" for i in range(layers)]
    present_names = [f"present_{i}" for i in range(layers)]
    axes = {
        "input_ids": {0: "batch_size", 1: "sequence_length"},
        "position_ids": {0: "batch_size", 1: "sequence_length"},
        "attention_mask": {0: "batch_size", 1: "total_sequence_length"},
        "logits": {0: "batch_size", 1: "sequence_length"},
        **{n: {1: "batch_size", 3: "past_sequence_length"} for n in past_names},
        **{n: {1: "batch_size", 3: "total_sequence_length"} for n in present_names},
    }
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            _stacked_wrapper(model), (ids, positions, mask, *past), str(dst / "model.onnx"),
            input_names=["input_ids", "position_ids", "attention_mask", *past_names],
            output_names=["logits", *present_names], dynamic_axes=axes, opset_version=opset,
            do_constant_folding=True, dynamo=False,  # the TorchScript tracer: the graph shape ORT's fusions match
        )


def export_genai(src: Path, dst: Path, opset: int, trust_remote_code: bool = False) -> None:
    """onnxruntime-genai's model builder as a library, fp32 for CPU: GroupQueryAttention (rotary
    inside) with the split KV cache, fused RMSNorms. the ``int4`` pass does the 4-bit step
    itself (the builder's int4 is what benchmarks/int4.py compares against)."""
    from onnxruntime_genai.models import builder

    with tempfile.TemporaryDirectory(prefix="xformopt-genai-") as cache, contextlib.redirect_stdout(sys.stderr):
        options = [f"hf_remote={str(trust_remote_code).lower()}"]
        extra = builder.parse_extra_options(None, str(src), str(dst), "fp32", "cpu", cache, options)
        builder.create_model(None, str(src), str(dst), "fp32", "cpu", cache, **extra)
    pin_head_dim(dst / "model.onnx", src)


def pin_head_dim(model_path: Path, config_dir: Path) -> None:
    """The builder leaves the cache's head dimension symbolic (``kv_cache_dim``); pin it from the
    config so a runner can size the zero-length past of step 0 from the graph alone."""
    import onnx

    config = json.loads((Path(config_dir) / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    model = onnx.load(model_path, load_external_data=False)
    for value in (*model.graph.input, *model.graph.output):
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param == "kv_cache_dim":
                dim.dim_value = int(head_dim)
    onnx.save(model, model_path)  # graph only: the weights stay in model.onnx.data


DYNAMO_EXPORTER_NAME = "torch.onnx.export(dynamo=True), split cache layout (xformopt.passes.export.decoder_dynamo)"


def export_dynamo(src: Path, dst: Path, opset: int, trust_remote_code: bool = False) -> str:
    """The plain dynamo export; returns what ran (with the linear-attention Loops when it wrote them)."""
    note = export_dynamo_decoder(src, dst, opset, trust_remote_code)
    return f"{DYNAMO_EXPORTER_NAME}; {note}" if note else DYNAMO_EXPORTER_NAME


DYNAMO_EXPORTER = (DYNAMO_EXPORTER_NAME, export_dynamo)
GQA_EXPORTER_NAME = ("torch.onnx.export(dynamo=True), GroupQueryAttention + rotary written at export, split cache "
                     "layout, no position_ids (xformopt.passes.export.decoder_gqa)")


def export_gqa_or_dynamo(src: Path, dst: Path, opset: int, trust_remote_code: bool = False) -> str:
    """The dynamo export with GroupQueryAttention layers, or (loudly) the plain dynamo export when the model's
    attention cannot be written that way (linear-attention states, shared key/values); returns which ran."""
    try:
        export_gqa_decoder(src, dst, opset, trust_remote_code)
        return GQA_EXPORTER_NAME
    except NotGroupQueryAttention as e:
        _log.warning(f"GroupQueryAttention export refused ({e}): exporting with the plain dynamo exporter "
                     "(serve batches it in left-padded rows, without the shared KV buffer)")
    return export_dynamo(src, dst, opset, trust_remote_code)


GQA_EXPORTER = (GQA_EXPORTER_NAME, export_gqa_or_dynamo)
EXPORTERS = {
    "gpt2": ("torch.onnx TorchScript tracer, ORT GPT-2 cache layout (xformopt.passes.export.decoder.export_gpt2)", export_gpt2),
    "genai": ("onnxruntime-genai model builder (fp32, GroupQueryAttention + rotary, split cache layout)", export_genai),
    "dynamo": DYNAMO_EXPORTER,
    "gqa": GQA_EXPORTER,
}


def exporter_for(model_type: str):
    """(description, function) from the family table; a model_type it does not know, and genai
    families when the optional builder is not installed (loudly), go through the dynamo exporter with
    GroupQueryAttention (:mod:`.decoder_gqa`), which falls back to the plain one where it cannot."""

    family = FAMILIES.get(model_type)
    if family is None or family.exporter not in EXPORTERS:
        return GQA_EXPORTER
    if family.exporter == "genai" and not families.genai_builder_available():
        _log.warning(f"{GENAI_EXTRA} is not installed: exporting {model_type} with torch's dynamo exporter and "
                     f"GroupQueryAttention written at export (pip install 'xformopt[genai]' for the builder)")
        return GQA_EXPORTER
    return EXPORTERS[family.exporter]


# --------------------------------------------------------------------------- parity


def _row_cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return row_cosine(a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1]))


def parity_prompts(texts, tokenizer, context: int | None, steps: int) -> list[list[int]]:
    """Token ids of real texts at three or more distinct lengths (several past lengths)."""
    limit = (context - steps - 1) if context else None
    prompts = []
    for text in parity_texts(texts, tokenizer):
        ids = list(tokenizer(text)["input_ids"])[:limit]
        if ids and ids not in prompts:
            prompts.append(ids)
    return prompts


def check_decoder_parity(torch_runner, onnx_runner, prompts: list[list[int]], steps: int = PARITY_STEPS) -> dict:
    """Greedy-decode ``steps`` tokens per prompt with PyTorch and compare the ONNX logits at every step
    (same tokens fed to both), then a left-padded batch of the first two prompts."""
    worst_diff, worst_cos, mismatched = 0.0, 1.0, 0
    past_lengths: set[int] = set()
    compared = 0

    def update(ref: np.ndarray, got: np.ndarray) -> None:
        nonlocal worst_diff, worst_cos, compared
        worst_diff = max(worst_diff, float(np.abs(ref - got).max()))
        worst_cos = min(worst_cos, float(_row_cosine(ref, got).min()))
        compared += 1

    for prompt in prompts:
        ids = np.asarray(prompt, dtype=np.int64)[None]
        ref, t_state = torch_runner.forward(ids)
        got, o_state = onnx_runner.forward(ids)
        past_lengths.add(0)
        update(ref, got)
        for _ in range(steps):
            token = ref[:, -1].argmax(-1)[:, None]
            mismatched += int((got[:, -1].argmax(-1) != ref[:, -1].argmax(-1)).sum())
            past_lengths.add(t_state.length)
            ref, t_state = torch_runner.forward(token, t_state)
            got, o_state = onnx_runner.forward(token, o_state)
            update(ref, got)

    padded = {}
    if not getattr(onnx_runner, "left_padding", True):
        padded = {"skipped": onnx_runner.padding_note}
    elif len(prompts) >= 2:  # left padding: the shorter prompt is padded on the left, as generate() pads
        pair = prompts[:2]
        width = max(len(p) for p in pair)
        ids = np.zeros((2, width), dtype=np.int64)
        mask = np.zeros((2, width), dtype=np.int64)
        for row, p in enumerate(pair):
            ids[row, width - len(p):] = p
            mask[row, width - len(p):] = 1
        ref, t_state = torch_runner.forward(ids, mask=mask)
        got, o_state = onnx_runner.forward(ids, mask=mask)
        diffs = [float(np.abs(ref[:, -1] - got[:, -1]).max())]
        for _ in range(3):
            token = ref[:, -1].argmax(-1)[:, None]
            ref, t_state = torch_runner.forward(token, t_state)
            got, o_state = onnx_runner.forward(token, o_state)
            diffs.append(float(np.abs(ref[:, -1] - got[:, -1]).max()))
        worst_diff = max(worst_diff, max(diffs))
        padded = {"batch": 2, "lengths": [len(p) for p in pair], "steps": 4, "max_abs_diff_last_position": max(diffs)}

    return {
        "max_abs_diff": worst_diff,
        "min_cosine": worst_cos,
        "prompt_lengths": [len(p) for p in prompts],
        "sequence_lengths": [len(p) for p in prompts],  # the encoders' key, read by the CLI summary line
        "steps_per_prompt": steps + 1,
        "past_lengths": sorted(past_lengths),
        "compared_steps": compared,
        "greedy_argmax_mismatches": mismatched,
        "padded_batch": padded,
    }


def export_decoder(ctx, src: Path, dst: Path, options) -> dict:
    """The export pass for text-generation: export with past, copy configs, verify every step."""
    import onnx

    how, exporter = exporter_for(ctx.spec.model_type)
    ctx.log(f"exporting {ctx.spec.model_type} (text-generation, with past key/values) at opset {options.opset}")
    how, onnx_runner, parity = _export_checked(ctx, src, dst, options, exporter, how)
    failure = _parity_failure(parity, options)
    if how == GQA_EXPORTER_NAME and failure:
        # GroupQueryAttention written at export suits the attention it was built for; a model type whose
        # attention does something it does not anticipate fails parity and takes the plain dynamo export.
        _log.warning(f"the GroupQueryAttention export of {ctx.spec.model_type} missed parity ({failure}): "
                     "exporting with the plain dynamo exporter")
        for path in dst.iterdir():
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        how, onnx_runner, parity = _export_checked(ctx, src, dst, options, DYNAMO_EXPORTER[1], DYNAMO_EXPORTER[0])
        failure = _parity_failure(parity, options)
    if failure:
        raise PassFailed(f"decoder export parity failed: {failure}")
    model = onnx.load(dst / "model.onnx", load_external_data=False)
    graph = model.graph
    layout = onnx_runner.layout
    fused = _fused_at_export(ctx, model, how)
    return {
        "exporter": how,
        "opset": next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), options.opset),
        **fused,
        "task": ctx.spec.task,
        "cache_layout": layout.kind,
        "past_inputs": len(layout.past_names),
        "inputs": [i.name for i in graph.input],
        "outputs": [o.name for o in graph.output],
        "nodes": len(graph.node),
        "dynamic_axes": {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in graph.input},
        "step0": "the prompt with a zero-length past (one graph for prompt and cached steps)",
        "parity": parity,
    }


def _export_checked(ctx, src: Path, dst: Path, options, exporter, how: str):
    """Export with ``exporter``, copy the configs, and compare every step of a greedy decode with PyTorch:
    (what ran, the ONNX runner, the parity record)."""
    with quiet_loggers("transformers", "torch.onnx", "onnxscript"):
        how = exporter(src, dst, options.opset, ctx.spec.trust_remote_code) or how  # the GQA route says which ran
    copy_config_files(src, dst)
    ctx.log("checking parity against PyTorch at every step of a greedy decode")
    tokenizer = load_tokenizer(src, ctx.spec.trust_remote_code)
    prompts = parity_prompts(ctx.sample_texts, tokenizer, context_window(src), PARITY_STEPS)
    onnx_runner = OrtDecoder(dst, threads=ctx.threads)
    parity = check_decoder_parity(TorchDecoder(src, threads=ctx.threads, trust_remote_code=ctx.spec.trust_remote_code),
                                  onnx_runner, prompts)
    return how, onnx_runner, parity


def _parity_failure(parity: dict, options) -> str | None:
    """What missed the export's parity limits, in words; None when both held."""
    if parity["max_abs_diff"] > options.max_abs_diff or parity["min_cosine"] < options.min_cosine:
        return (f"max |logit diff| {parity['max_abs_diff']:.2e} (limit {options.max_abs_diff:.0e}), min cosine "
                f"{parity['min_cosine']:.6f} (limit {options.min_cosine}) over past lengths {parity['past_lengths']}")
    return None


def _fused_at_export(ctx, model, how: str) -> dict:
    """The builder fuses while it writes the graph: count and verify its fused ops per layer here."""
    family = FAMILIES.get(ctx.spec.model_type)
    if family is None or family.exporter != "genai" or "genai" not in how:
        return {}
    counts = {op: n for op, n in fused_counts(model).items() if n}
    expected = {op: n * ctx.spec.num_layers for op, n in family.fused_per_layer.items()}
    short = {op: (counts.get(op, 0), n) for op, n in expected.items() if counts.get(op, 0) < n}
    if short:
        detail = ", ".join(f"{op} {got}/{want}" for op, (got, want) in short.items())
        raise PassFailed(f"the genai builder's graph fell short of the fused ops expected: {detail} (fused {counts})")
    return {"fused": counts, "expected_fused": expected, "decoder": attention_record(ctx.spec, counts)}
