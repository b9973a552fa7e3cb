"""Model families: one row of facts per Hugging Face ``model_type`` (data, not if-chains).

A row says what every pass needs to know about a family: ONNX Runtime's optimizer type, where the
config keeps its shape (layers, heads, hidden size, positions and their offset), which fused ops each
layer must reach, which exporter writes it, and where prune/distill find its modules (attribute paths
from the base model and from one layer). Adding a family is one row; code only where a library cannot
do it (an exporter, a fusion).

``exporter`` for decoders (:mod:`xformopt.passes.export.decoder`):

- ``gpt2``: xformopt's own TorchScript export in ONNX Runtime's GPT-2 layout, then ORT's GPT-2
  ``Attention`` fusion in ``fuse``;
- ``genai``: onnxruntime-genai's model builder used as a library (optional extra ``genai``): every
  layer's attention and rotary embedding as one ``GroupQueryAttention`` plus fused RMSNorms. Without
  the extra these families fall back to the ``gqa`` decoder exporter;
- ``gqa``: torch's dynamo exporter with every layer's attention written as ``GroupQueryAttention`` (rotary
  inside, no ``position_ids``: the builder's layout, which serve's continuous batching takes;
  xformopt/passes/export/decoder_gqa.py). A causal LM whose ``model_type`` has no row here takes this
  route too (the generic row :func:`family_of` builds), with no fusions required: the record says which
  fired. Where a model's attention cannot be written so (linear-attention states, layers sharing key/values)
  it falls back, loudly, to ``dynamo`` (``fallback_per_layer``);
- ``dynamo``: torch's dynamo exporter with the KV cache as inputs/outputs (xformopt/passes/export/decoder_dynamo.py),
  then onnxscript's ORT fusions in ``fuse`` (attention as MultiHeadAttention). Qwen3.5 text takes it: its
  Gated DeltaNet states have no place in a shared KV buffer, so serve runs it one sequence at a time.

Encoders are exported by torch's dynamo exporter (``dynamo``, every row's default), whose graphs go
through onnxscript's ORT fusion rewriter and then ORT's optimizer in ``fuse``; ``torchscript`` (torch's
TorchScript tracer over eager attention) is kept for a model torch.export cannot trace. A recipe's
``export: {exporter: ...}`` wins over the row.

A model type the table does not know still runs (:func:`family_of` builds a generic row from
transformers' own auto-class tables: an encoder, a decoder, or an encoder-decoder with a
``*ForConditionalGeneration`` class, which takes the ``seq2seq`` exporter): the table only adds speed
(fusions each layer must reach, a family's own fusion, INT8 outlier rules) and the module layout prune
and distill need.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from xformopt.errors import InputError

GENAI_EXTRA = "onnxruntime-genai"  # the pip name; xformopt's extra is `pip install 'xformopt[genai]'`
SEQ2SEQ = "seq2seq"  # the encoder-decoder exporter (xformopt/seq2seq/export.py)


@dataclass(frozen=True)
class Layout:
    """Where prune and distill reach a family's modules: dotted attribute paths (data, not code).

    ``layers`` is from the base model (``model.base_model``); the rest are from one layer, except the
    config keys, which name the config attributes a pruned model must rewrite."""

    layers: str
    heads: str  # int attribute: the layer's attention head count
    head_dim: str  # int attribute: one head's width
    attn_value: str  # the value projection (its output rows are the heads)
    attn_out: str  # the attention output projection
    ffn_in: str
    ffn_out: str
    layers_key: str  # config: number of layers
    ffn_key: str  # config: FFN width
    hidden_key: str  # config: hidden size
    layer_count_attr: str | None = None  # a module attribute that caches the layer count too
    head_pruning: bool = True  # False: heads stay whole (prune cuts FFN width and layers only)
    # an Embedding (path from the base model) with one column per head that every layer shares (MPNet's
    # relative-position bias): a head pruned is pruned in every layer and its column cut (models/pruned_heads.py)
    shared_head_bias: str = ""
    attn_query: str = ""  # the query and key projections (distill's MiniLM relation loss reads their outputs)
    attn_key: str = ""
    # distill's intermediate-layer losses this family supports (xformopt/passes/distill/losses.py): hidden_mse
    # (token states through the layer map, projected when widths differ), attention_mse (head-averaged
    # attention maps), relation_kl (MiniLM's query/key/value relations of the last layer pair)
    distill_terms: tuple[str, ...] = ("hidden_mse", "attention_mse", "relation_kl")

    @staticmethod
    def get(obj: Any, path: str) -> Any:
        for name in path.split("."):
            obj = getattr(obj, name)
        return obj

    @staticmethod
    def set(obj: Any, path: str, value: Any) -> None:
        *parents, last = path.split(".")
        for name in parents:
            obj = getattr(obj, name)
        setattr(obj, last, value)


BERT_LAYOUT = Layout(
    layers="encoder.layer", heads="attention.self.num_attention_heads",
    head_dim="attention.self.attention_head_size", attn_value="attention.self.value",
    attn_out="attention.output.dense", ffn_in="intermediate.dense", ffn_out="output.dense",
    layers_key="num_hidden_layers", ffn_key="intermediate_size", hidden_key="hidden_size",
    attn_query="attention.self.query", attn_key="attention.self.key",
)
DISTILBERT_LAYOUT = Layout(
    layers="transformer.layer", heads="attention.n_heads", head_dim="attention.attention_head_size",
    attn_value="attention.v_lin", attn_out="attention.out_lin", ffn_in="ffn.lin1", ffn_out="ffn.lin2",
    layers_key="n_layers", ffn_key="hidden_dim", hidden_key="dim", layer_count_attr="transformer.n_layers",
    attn_query="attention.q_lin", attn_key="attention.k_lin",
)
# MPNet keeps q/k/v/o side by side in ``attention.attn`` (o is the output projection, its LayerNorm
# sits one level up in ``attention``). Its attention probabilities include the relative-position bias,
# which a student shares with the teacher: attention_mse is not offered (the relations and hidden states
# carry what differs). Heads prune the same in every layer: the encoder computes one relative-position
# bias (an Embedding with one column per head) and adds it in every layer, so a removed head is removed
# from every layer and its column cut from the bias (``shared_head_bias``; transformers 4's MPNet
# ``prune_heads`` left the bias at full width and the forward failed on the shape).
MPNET_LAYOUT = Layout(
    layers="encoder.layer", heads="attention.attn.num_attention_heads",
    head_dim="attention.attn.attention_head_size", attn_value="attention.attn.v",
    attn_out="attention.attn.o", ffn_in="intermediate.dense", ffn_out="output.dense",
    layers_key="num_hidden_layers", ffn_key="intermediate_size", hidden_key="hidden_size",
    shared_head_bias="encoder.relative_attention_bias", attn_query="attention.attn.q", attn_key="attention.attn.k", distill_terms=("hidden_mse", "relation_kl"),
)


@dataclass(frozen=True)
class Family:
    model_type: str
    decoder: bool
    ort_model_type: str  # ONNX Runtime transformer-optimizer model type used by `fuse`
    fused_per_layer: dict[str, int]  # fused ops each layer must reach after export (genai) or fuse
    exporter: str = "dynamo"  # "dynamo" | "torchscript" (encoders) | "gpt2" | "genai" | "gqa" | "dynamo" (decoders)
    layers_keys: tuple[str, ...] = ("num_hidden_layers",)
    heads_keys: tuple[str, ...] = ("num_attention_heads",)
    hidden_keys: tuple[str, ...] = ("hidden_size",)
    # one head's width where the config names it (T5's d_kv, any config's head_dim): then the attention is
    # heads x that width, not the hidden size split across heads (flan-t5-small: 6 heads of 64, d_model 512)
    head_dim_keys: tuple[str, ...] = ("head_dim",)
    positions_keys: tuple[str, ...] = ("max_position_embeddings",)
    position_offset: int = 0  # positions the embedding table reserves (RoBERTa: padding_idx + 1)
    fallback_per_layer: dict[str, int] = field(default_factory=dict)
    grouped_query: bool = False  # the config may share KV heads (num_key_value_heads)
    layout: Layout | None = None  # None: prune and distill do not reach this family's modules
    # "module:function" run on ORT's OnnxModel after its optimizer, for families whose attention ORT
    # does not fuse (function(onnx_model, spec) adds the fused nodes); None: ORT's fusions suffice.
    own_fusion: str | None = None
    # GEMMs whose inputs carry activation outliers that per-tensor INT8 cannot hold: (regex, treatment),
    # full match on the exported ONNX node name or its module path, treatment "smooth", "split" or "float"
    # (xformopt/passes/quantize/outliers.py); quantize applies them unless told not to (outlier_rules: false).
    int8_outliers: tuple[tuple[str, str], ...] = ()
    # encoder-decoders whose artifact also gets generate.onnx: the whole decode loop in ONNX Runtime's BeamSearch op,
    # whose T5 branch (model_type=1) fits our two graphs (xformopt/seq2seq/beam_search_graph.py); the others decode
    # in the Python loop (BART and mBART force BOS/EOS tokens and Marian bans its pad token: rules the op lacks)
    search_graph: bool = False
    generic: bool = False  # built by family_of for a model type the table does not know (no row of facts)

    def config_item(self, config: dict, keys: tuple[str, ...]) -> tuple[str, Any] | None:
        """(key, value) of the first of ``keys`` set in ``config`` or, for an encoder-decoder whose config
        nests its halves (T5Gemma: ``encoder`` with its own ``text_config``), in its encoder's text part."""
        for part in _text_parts(config):
            found = next(((k, part[k]) for k in keys if part.get(k) is not None), None)
            if found is not None:
                return found
        return None

    def config_value(self, config: dict, keys: tuple[str, ...]) -> Any:
        item = self.config_item(config, keys)
        return None if item is None else item[1]

    def shape(self, config: dict) -> tuple[int, int, int]:
        """(layers, heads, hidden size) from a config dict, under this family's key names."""
        return tuple(int(self.config_value(config, keys) or 0)
                     for keys in (self.layers_keys, self.heads_keys, self.hidden_keys))

    def expected_fusions(self, layers: int, graph_counts: dict[str, int] | None = None,
                         config: dict | None = None) -> dict[str, int]:
        """Fused ops ``layers`` layers must reach (``fused_per_layer``): for a family exported by
        onnxruntime-genai's builder or the GQA export, its set when the input graph has GroupQueryAttention,
        the plain dynamo export's set (``fallback_per_layer``) otherwise. A model whose layers reuse another
        layer's key/value (``num_kv_shared_layers``) is held to its other fusions only: onnxscript's attention
        rules do not match a key/value that feeds two layers' attention."""
        built = self.exporter not in ("genai", "gqa") or (graph_counts or {}).get("GroupQueryAttention", 0) > 0
        per_layer = self.fused_per_layer if built else self.fallback_per_layer
        if kv_shared_layers(config or {}):
            per_layer = {op: n for op, n in per_layer.items() if op not in ("MultiHeadAttention", "GroupQueryAttention")}
        return {op: n * layers for op, n in per_layer.items()}

    @property
    def graph(self) -> str:
        """The kind of graph this family exports (a task's ``graph`` must be the same): "decoder" (KV
        cache), "seq2seq" (encoder graph + cached decoder graph, xformopt/seq2seq/) or "encoder"."""
        return "decoder" if self.decoder else "seq2seq" if self.exporter == SEQ2SEQ else "encoder"

    def export_route(self, asked: str | None = None) -> str:
        """Which exporter writes this family's graph: a decoder's own (``gpt2``, ``genai``: a KV cache,
        xformopt/passes/export/decoder.py) or the encoder-decoder one (``seq2seq``); for an encoder the one a
        recipe asks for (``torchscript`` or ``dynamo``), else the row's."""
        if self.decoder or self.exporter == SEQ2SEQ:
            return self.exporter
        return asked or self.exporter

    def positions(self, config: dict) -> int | None:
        """How many tokens the model can embed, less the family's reserved positions."""
        limit = self.config_value(config, self.positions_keys)
        if not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0:
            return None
        limit -= self.position_offset
        return limit if limit > 0 else None


_ENCODER_FUSED = {"Attention": 1, "SkipLayerNormalization": 2}
_DEBERTA_FUSED = {"MultiHeadAttention": 1, "SkipLayerNormalization": 2}
# Builder families without the genai extra, and the generic decoder row, go through the GQA export
# (GroupQueryAttention written at export, then these RMSNorm fusions: _GQA). Where that export refuses a model,
# the plain dynamo decoder export after onnxscript's fusions (transformers 5.23, onnxscript 0.7.2, tiny configs):
# attention through SDPA -> MultiHeadAttention (GroupQueryAttention's rule needs the causal-mask pattern of
# older transformers and does not fire), two SkipSimplifiedLayerNorms per layer; the RotaryEmbedding rule
# matches but its cos/sin-cache rule does not, so rotary is left as plain ops.
_DYNAMO_DECODER = {"MultiHeadAttention": 1, "SkipSimplifiedLayerNormalization": 2}
_GQA = {"GroupQueryAttention": 1, "SkipSimplifiedLayerNormalization": 2}
# ModernBERT through onnxscript: one MultiHeadAttention (global and sliding-window layers alike: the
# window is in the attention-bias input) and two SkipLayerNorms per layer; rotary on q and k into two
# RotaryEmbedding per layer by xformopt's rule (xformopt/fusions/rotary.py): onnxscript 0.7.2's cos/sin rule
# expects transformers 4's MatMul-form frequencies, transformers 5 writes a broadcast Mul.
_MODERNBERT_FUSED = {"MultiHeadAttention": 1, "SkipLayerNormalization": 2, "RotaryEmbedding": 2}
_ROTARY_ENCODER_FUSED = {"MultiHeadAttention": 1, "SkipLayerNormalization": 2}


def _text_parts(config: dict) -> list[dict]:
    """The config, then its encoder's config and that one's text config where they are nested dicts."""
    parts = [config]
    encoder = config.get("encoder")
    if isinstance(encoder, dict):
        parts.append(encoder)
        if isinstance(encoder.get("text_config"), dict):
            parts.append(encoder["text_config"])
    return parts


def _bert_like(model_type: str, offset: int = 0) -> Family:
    return Family(model_type, False, "bert", _ENCODER_FUSED, position_offset=offset, layout=BERT_LAYOUT)


# --- encoder-decoder families (xformopt/seq2seq/): an encoder graph and a cached decoder graph, exported by
# torch's dynamo exporter; onnxscript fuses each layer's attention (self and cross) into MultiHeadAttention
# (the encoder's own self-attention into Attention where it matches) in `fuse`, counted per graph there.
# The shape keys cover T5, BART/Marian and the nested configs of T5Gemma (Family.config_item); the export
# reads the cache's real shape off the model, not these.
_SEQ2SEQ_SHAPE = dict(layers_keys=("num_layers", "encoder_layers", "num_hidden_layers"),
                      heads_keys=("num_heads", "encoder_attention_heads", "num_attention_heads"),
                      hidden_keys=("d_model", "hidden_size"), head_dim_keys=("d_kv", "head_dim"),
                      positions_keys=("max_position_embeddings",))


# T5's FFN output projection (DenseReluDense.wo, by module path): smooth, as measured in benchmarks/seq2seq_int8.py.
_T5_OUTLIERS = ((r"model\.(encoder|decoder)\.block\.\d+\.layer\.\d+\.DenseReluDense\.wo", "smooth"),)


def _seq2seq(model_type: str, ort_type: str, int8_outliers: tuple[tuple[str, str], ...] = (),
             search_graph: bool = False) -> Family:
    return Family(model_type, False, ort_type, {}, exporter=SEQ2SEQ, int8_outliers=int8_outliers,
                  search_graph=search_graph, **_SEQ2SEQ_SHAPE)


def _genai(model_type: str) -> Family:
    return Family(model_type, True, "gpt2", _GQA, exporter="genai", fallback_per_layer=_DYNAMO_DECODER,
                  grouped_query=True)


FAMILIES: dict[str, Family] = {f.model_type: f for f in (
    _bert_like("bert"),
    _bert_like("electra"),
    _bert_like("roberta", offset=2),
    _bert_like("xlm-roberta", offset=2),
    _bert_like("camembert", offset=2),
    # DeBERTa-v2/v3: relative (disentangled) attention; v3 has no absolute positions
    # (position_biased_input: false), but max_position_embeddings still bounds the tokenizer. ORT's BERT
    # fuser matches its layer norms only; attention is xformopt's own fusion into MultiHeadAttention.
    # No layout: transformers cannot prune DeBERTa heads (DebertaV2Model._prune_heads raises, so a
    # config.pruned_heads would not reload), and a head is also rows of the position projections
    # (pos_key_proj/pos_query_proj, or query/key_proj applied to the relative embeddings).
    # Exported by the dynamo exporter like every encoder: onnxscript fuses no DeBERTa attention (its layer
    # norms and GELUs only); xformopt's fusion (xformopt/fusions/deberta_v2.py) matches the dynamo graph and
    # the TorchScript tracer's (``exporter: torchscript``, the fallback) alike.
    Family("deberta-v2", False, "bert", _DEBERTA_FUSED, own_fusion="xformopt.fusions.deberta_v2:fuse"),
    Family("distilbert", False, "bert", _ENCODER_FUSED, layers_keys=("n_layers",), heads_keys=("n_heads",),
           hidden_keys=("dim",), layout=DISTILBERT_LAYOUT),
    # layers[i].attn.Wqkv packs q, k and v in one Linear: head pruning would have to split it (no layout).
    Family("modernbert", False, "bert", _MODERNBERT_FUSED, exporter="dynamo"),
    # MPNet: positions start after padding_idx (1), as RoBERTa's. ORT's BERT fuser matches its layer norms
    # but no attention (relative position bias on the scores): own fusion into MultiHeadAttention with the
    # bias as attention_bias (xformopt/fusions/mpnet.py).
    # INT8 on all-mpnet-base-v2: the FFN inputs (layer-norm outputs, a few channels at |x| ~ 50 against a
    # median of 1.5) and the FFN output projections' inputs (post-GELU, up to |x| ~ 100 against 2) take
    # mean cosine to float from 0.9996 to 0.861 when plainly quantized; smoothing the first and splitting
    # the 8 largest channels of the second keep every GEMM INT8 at 0.996 (benchmarks/mpnet.py).
    Family("mpnet", False, "bert", {"MultiHeadAttention": 1, "SkipLayerNormalization": 2}, position_offset=2,
           layout=MPNET_LAYOUT, own_fusion="xformopt.fusions.mpnet:fuse",
           int8_outliers=((r"/encoder/layer\.\d+/intermediate/dense/MatMul", "smooth"),
                          (r"/encoder/layer\.\d+/output/dense/MatMul", "split"))),
    # Encoders transformers 5 added (rotary positions, so no position offset). onnxscript fuses their
    # attention into MultiHeadAttention with the rotary inside; EuroBERT's RMSNorms into
    # SkipSimplifiedLayerNormalization. No layout: prune and distill do not reach their modules yet.
    Family("eurobert", False, "bert", {"MultiHeadAttention": 1, "SkipSimplifiedLayerNormalization": 2}),
    Family("gte", False, "bert", _ROTARY_ENCODER_FUSED),
    Family("nomic_bert", False, "bert", _ROTARY_ENCODER_FUSED),
    Family("jina_embeddings_v3", False, "bert", _ROTARY_ENCODER_FUSED),
    Family("gpt2", True, "gpt2", {"Attention": 1, "SkipLayerNormalization": 2}, exporter="gpt2",
           layers_keys=("n_layer",), heads_keys=("n_head",), hidden_keys=("n_embd",), positions_keys=("n_positions", "n_ctx")),
    _genai("llama"),
    _genai("mistral"),
    _genai("qwen2"),
    _genai("qwen3"),
    _genai("phi3"),
    # Ministral 3 and Gemma 4 text: torch's dynamo exporter with GroupQueryAttention written at export
    # (xformopt/passes/export/decoder_gqa.py: rotary inside, positions from the mask, the genai builder's
    # layout, so serve batches them continuously). Ministral 3: llama-like with YaRN rope and a
    # position-dependent query scale (llama4-style attn_scale), applied before the attention op.
    # fallback_per_layer: what the plain dynamo export fuses, where the GQA export refuses the model.
    Family("ministral3", True, "gpt2", _GQA, exporter="gqa", grouped_query=True,
           fallback_per_layer={"SkipSimplifiedLayerNormalization": 2}),
    # Gemma 4 text: sliding-window layers (GroupQueryAttention's local_window_size) and full-attention layers
    # with their own head_dim; its two tanh GELUs (MLP, per-layer input gate) fuse as FastGelu; its RMSNorms
    # do not fuse. Layers reusing another layer's key/value (num_kv_shared_layers) are refused by the GQA
    # export and go through the plain dynamo export, where attention fuses as MultiHeadAttention (not with
    # shared key/values: see expected_fusions).
    # ort_model_type "none": onnxscript's fusions only. ORT 1.32's GPT-2 optimizer leaves this graph
    # unsortable ("Graph is not a DAG") even with every fusion switched off.
    Family("gemma4_text", True, "none", {"GroupQueryAttention": 1, "FastGelu": 2}, exporter="gqa",
           grouped_query=True, fallback_per_layer={"MultiHeadAttention": 1, "FastGelu": 2}),
    # Qwen3.5 text: Gated DeltaNet (linear attention) layers carry conv/recurrent states, every 4th layer is
    # full attention (MultiHeadAttention after fuse); every layer's two (1 + w) RMSNorms fuse.
    Family("qwen3_5_text", True, "gpt2", {"SkipSimplifiedLayerNormalization": 2}, exporter="dynamo",
           grouped_query=True),
    _seq2seq("t5", "t5", int8_outliers=_T5_OUTLIERS, search_graph=True),
    _seq2seq("mt5", "t5", int8_outliers=_T5_OUTLIERS, search_graph=True),
    _seq2seq("bart", "bart"),
    _seq2seq("mbart", "bart"),
    _seq2seq("marian", "bart"),
    # T5Gemma 2 (text-only use: its encoder's vision tower is not exported): RMSNorm, rotary, grouped KV;
    # its decoder merges self- and cross-attention into one attention per layer, so the decoder graph
    # fuses one MultiHeadAttention per layer. (T5Gemma 1 has no row: its soft-capped attention logits keep
    # onnxscript from fusing any attention, so it takes the generic encoder-decoder route.)
    _seq2seq("t5gemma2", "bart"),
)}

ENCODERS = tuple(name for name, f in FAMILIES.items() if f.graph == "encoder")
SEQ2SEQS = tuple(name for name, f in FAMILIES.items() if f.graph == SEQ2SEQ)
DECODERS = tuple(name for name, f in FAMILIES.items() if f.decoder)


# Config keys of the shape under the names transformers' configs use (first present wins): a generic
# row reads these, as the table's rows read their own.
_GENERIC_KEYS = {"layers_keys": ("num_hidden_layers", "n_layer", "n_layers", "num_layers"),
                 "heads_keys": ("num_attention_heads", "n_head", "n_heads", "num_heads"),
                 "hidden_keys": ("hidden_size", "n_embd", "dim", "d_model"), "head_dim_keys": ("head_dim", "d_kv"),
                 "positions_keys": ("max_position_embeddings", "n_positions", "n_ctx")}


def family_of(model_type: str | None) -> Family:
    """The family row for ``model_type``: the table's, else a generic row for any text model type
    transformers itself knows (encoder-decoder, decoder or encoder by its auto classes: _generic_kind),
    else a one-line InputError."""
    family = FAMILIES.get(model_type or "") or _GENERIC_ROWS.get(model_type or "")
    if family is not None:
        return family
    kind = _generic_kind(model_type or "")
    if kind is None:
        raise InputError(f"unsupported architecture {model_type!r}: transformers has no model type of that name "
                         "(custom code needs --trust-remote-code and a model type transformers registers); "
                         f"families with tuned fusions: encoders {', '.join(ENCODERS)}; decoders {', '.join(DECODERS)}; "
                         f"encoder-decoders (translation, summarization) {', '.join(SEQ2SEQS)}")
    return _generic_row(model_type, kind)


def _generic_kind(model_type: str) -> str | None:
    """"seq2seq" (transformers has a ``*ForConditionalGeneration`` text-to-text class for it), "decoder"
    (a causal-LM class and no masked-LM class), "encoder", or None (transformers does not know ``model_type``)."""
    from transformers.models.auto import modeling_auto
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if model_type not in CONFIG_MAPPING_NAMES:
        return None
    if model_type in modeling_auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES:
        return SEQ2SEQ
    causal = model_type in modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    return "decoder" if causal and model_type not in modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES else "encoder"


_GENERIC_ROWS: dict[str, Family] = {}


def custom_code_family(model_type: str, auto_map: dict) -> Family:
    """A generic row for a model type only its own (trusted) code defines: encoder-decoder when its
    auto_map names a seq2seq-LM class, decoder when a causal-LM class and no masked-LM class."""
    if "AutoModelForSeq2SeqLM" in auto_map:
        return _generic_row(model_type, SEQ2SEQ)
    decoder = "AutoModelForCausalLM" in auto_map and "AutoModelForMaskedLM" not in auto_map
    return _generic_row(model_type, "decoder" if decoder else "encoder")


def _generic_row(model_type: str, kind: str) -> Family:
    if model_type not in _GENERIC_ROWS:
        if kind == SEQ2SEQ:  # no fusion required: the fuse record says which fired
            row = Family(model_type, False, "bart", {}, exporter=SEQ2SEQ, generic=True, **_SEQ2SEQ_SHAPE)
        else:
            decoder = kind == "decoder"
            row = Family(model_type, decoder, "gpt2" if decoder else "bert", {}, generic=True, **_GENERIC_KEYS)
        _GENERIC_ROWS[model_type] = row
    return _GENERIC_ROWS[model_type]


def layout_of(model_type: str, pass_name: str) -> Layout:
    """Where ``model_type``'s prunable/distillable modules live, or an InputError naming the families that have them."""
    family = FAMILIES.get(model_type)
    if family is None or family.layout is None:  # a generic row has no layout either
        supported = ", ".join(name for name, f in FAMILIES.items() if f.layout is not None)
        raise InputError(f"unsupported architecture {model_type!r} for pass {pass_name!r}: it takes encoders "
                         f"whose modules it knows ({supported})")
    return family.layout


# Layer types with fixed-size state the dynamo export carries as past_key_values.{i}.conv / .recurrent
# (xformopt/passes/export/decoder_dynamo.py), per model type: tested ones only.
STATE_LAYERS = {"qwen3_5_text": ("linear_attention",)}


def kv_shared_layers(config: dict) -> int:
    """How many layers reuse another layer's key/value cache (Gemma 4's ``num_kv_shared_layers``)."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    return int(text.get("num_kv_shared_layers") or 0)


def refuse_unexportable_cache(config: dict) -> None:
    """The dynamo export carries one key/value pair per layer that keeps one (layers reusing another
    layer's, Gemma 4's ``num_kv_shared_layers``, keep none), or the states of the linear-attention layers
    in ``STATE_LAYERS``: other layers with state (Mamba, convolutions) are refused in one line."""
    model_type = config.get("model_type")
    carried = {"full_attention", "sliding_attention", "chunked_attention", *STATE_LAYERS.get(model_type, ())}
    odd = sorted(set(config.get("layer_types") or ()) - carried)
    if odd:
        raise InputError(f"{model_type}: layers of type {', '.join(odd)} keep state beyond a key/value cache, which "
                         "the dynamo decoder export does not carry")


def genai_builder_available() -> bool:
    try:
        import onnxruntime_genai.models.builder  # noqa: F401
    except Exception:  # ImportError, or a builder release that imports newer transformers classes
        return False
    return True
