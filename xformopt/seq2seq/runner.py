"""The model side of encoder-decoder generation: ``start`` (encoder, cross-attention cache, first
decoder step) and ``step`` (one cached decoder step), for an ONNX artifact and for the PyTorch model.

Both return the last position's logits (float32, ``[batch, vocab]``) and a :class:`Cache` of numpy
arrays, so the search (:mod:`xformopt.seq2seq.generate`) and every measurement treat them alike.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from xformopt.models.cache_names import cache_kwargs, output_cache
from xformopt.models.quiet import load_quietly
from xformopt.runtime.session import ort_session
from xformopt.seq2seq import DECODER_FILE, ENCODER_FILE


@dataclass
class Cache:
    """Per row: the source mask, the self-attention past (2 per layer, growing) and the cross-attention
    cache (2 per layer, fixed)."""

    mask: np.ndarray
    self_kv: list[np.ndarray]
    cross_kv: list[np.ndarray]

    def select(self, rows) -> Cache:
        """The cache of ``rows`` (beam reordering, a batch's rows repeated per beam)."""
        rows = np.asarray(rows)
        return Cache(self.mask[rows], [a[rows] for a in self.self_kv], [a[rows] for a in self.cross_kv])

    def reorder(self, rows) -> Cache:
        """The cache after beam search picks ``rows`` (each a beam of the same source): only the self-attention
        past differs between a source's beams, so the source mask and cross-attention cache stay as they are."""
        rows = np.asarray(rows)
        if np.array_equal(rows, np.arange(len(rows))):
            return self
        return Cache(self.mask, [a[rows] for a in self.self_kv], self.cross_kv)

    @property
    def length(self) -> int:
        return int(self.self_kv[0].shape[2])


def split_present(arrays: list[np.ndarray], cross: bool) -> tuple[list, list]:
    """(self, cross) lists from a flat per-layer [self k, self v, (cross k, cross v)] list."""
    width = 4 if cross else 2
    self_kv = [a for i in range(0, len(arrays), width) for a in arrays[i:i + 2]]
    cross_kv = [a for i in range(0, len(arrays), width) for a in arrays[i + 2:i + 4]] if cross else []
    return self_kv, cross_kv


class OrtSeq2Seq:
    """The two graphs of a seq2seq artifact in ONNX Runtime sessions."""

    def __init__(self, path: str | Path, threads: int | None = None, bind_io: bool = False, search=None):
        """``search``: the artifact's BeamSearch graph (:func:`xformopt.seq2seq.search_graph.open_search_graph`), which
        :func:`xformopt.seq2seq.generate.generate` runs where the settings allow; None: the Python loop always.
        ``bind_io``: each step with IO binding (:meth:`step`). Off by default: measured interleaved on the shared
        2-vCPU host, binding ten to thirty inputs and outputs per step cost more than ``run``'s numpy outputs
        (t5-small shapes, batch 1: 0.87x greedy, 0.97x with 4 beams; 1.06x at batch 8 with 4 beams; docs/seq2seq.md)."""
        self.path, self.bind_io, self.search = Path(path), bind_io, search
        self.encoder = ort_session(self.path / ENCODER_FILE, threads)
        # workers sleep between ops (the session default): letting them spin, as a decoder-only model's do, made
        # t5-small's steps slower at 2 threads on a shared 2-core host (0.66x greedy, 0.53x with 4 beams; docs/seq2seq.md)
        self.decoder = ort_session(self.path / DECODER_FILE, threads)
        self.past_names = [i.name for i in self.decoder.get_inputs()][2:]
        outputs = self.decoder.get_outputs()
        self.present_names = [o.name for o in outputs[1:]]
        vocab = outputs[0].shape[-1]
        self.vocab = vocab if isinstance(vocab, int) else None  # else read off the first step's logits
        self.config = json.loads((self.path / "config.json").read_text(encoding="utf-8"))

    @staticmethod
    def encoder_feed(input_ids: np.ndarray, attention_mask: np.ndarray) -> dict[str, np.ndarray]:
        """The encoder graph's inputs (also what static INT8 calibrates it on: :mod:`xformopt.seq2seq.feeds`)."""
        return {"input_ids": input_ids.astype(np.int64), "attention_mask": attention_mask.astype(np.int64)}

    @staticmethod
    def decoder_feed(tokens: np.ndarray, cache: Cache) -> dict[str, np.ndarray]:
        """The decoder graph's inputs for one cached step."""
        feed = {"decoder_input_ids": tokens.astype(np.int64), "encoder_attention_mask": cache.mask}
        for i in range(len(cache.cross_kv) // 2):
            feed[f"past.{i}.decoder.key"], feed[f"past.{i}.decoder.value"] = cache.self_kv[2 * i:2 * i + 2]
            feed[f"past.{i}.encoder.key"], feed[f"past.{i}.encoder.value"] = cache.cross_kv[2 * i:2 * i + 2]
        return feed

    def start(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> tuple[np.ndarray, Cache]:
        feed = self.encoder_feed(input_ids, attention_mask)
        out = self.encoder.run(None, feed)
        self.vocab = self.vocab or int(out[1].shape[-1])
        self_kv, cross_kv = split_present(out[2:], cross=True)
        return out[1][:, -1].astype(np.float32), Cache(feed["attention_mask"], self_kv, cross_kv)

    def encoder_states(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        return self.encoder.run(["last_hidden_state"], {"input_ids": input_ids.astype(np.int64),
                                                        "attention_mask": attention_mask.astype(np.int64)})[0]

    def step(self, tokens: np.ndarray, cache: Cache) -> tuple[np.ndarray, Cache]:
        """One cached step. Through ``run`` by default; with ``bind_io``, IO binding: ORT reads the cache's arrays
        where they lie and writes the logits and the grown self-attention past into arrays allocated here."""
        if self.vocab is None or not self.bind_io:
            out = self.decoder.run(None, self.decoder_feed(tokens, cache))
            self.vocab = int(out[0].shape[-1])
            return out[0][:, -1].astype(np.float32), Cache(cache.mask, list(out[1:]), cache.cross_kv)
        binding = self.decoder.io_binding()
        for name, array in self.decoder_feed(tokens, cache).items():
            binding.bind_cpu_input(name, np.ascontiguousarray(array))
        batch, new = tokens.shape
        logits = _bind_new(binding, "logits", (batch, new, self.vocab), np.float32)
        presents = [_bind_new(binding, name, (*past.shape[:2], past.shape[2] + new, *past.shape[3:]), past.dtype)
                    for name, past in zip(self.present_names, cache.self_kv)]
        self.decoder.run_with_iobinding(binding)
        return logits[:, -1], Cache(cache.mask, presents, cache.cross_kv)


def _bind_new(binding, name: str, shape: tuple, dtype) -> np.ndarray:
    """A new array bound as the output ``name``: ORT writes into it."""
    array = np.empty(shape, dtype=dtype)
    binding.bind_output(name, "cpu", 0, array.dtype, list(shape), array.ctypes.data)
    return array


def decoder_start_token(model) -> int:
    """The token the decoder starts from: the generation config's, else the model config's (T5Gemma 2's
    config has none: its checkpoints name it in generation_config.json), else the BOS token."""
    for value in (model.generation_config.decoder_start_token_id, getattr(model.config, "decoder_start_token_id", None),
                  model.generation_config.bos_token_id):
        if value is not None:
            return int(value)
    raise ValueError("the model names no decoder_start_token_id (generation_config.json or config.json)")


class TorchSeq2Seq:
    """The PyTorch model behind the same two calls (the baseline every stage is compared with)."""

    def __init__(self, path: str | Path | None = None, threads: int | None = None, model=None):
        import torch
        from transformers import AutoModelForSeq2SeqLM

        if threads:
            torch.set_num_threads(threads)
        self.path = Path(path) if path is not None else None
        self.model = (model or load_quietly(AutoModelForSeq2SeqLM.from_pretrained, self.path)).eval()
        self.config = self.model.config.to_dict()
        self.start_token = decoder_start_token(self.model)

    def _run(self, tokens, mask, states, cache: Cache | None):
        import torch
        from transformers import DynamicCache, EncoderDecoderCache
        from transformers.modeling_outputs import BaseModelOutput

        config = self.model.config
        if cache is None:
            past = EncoderDecoderCache(DynamicCache(config=config), DynamicCache(config=config))
        else:
            t = [torch.from_numpy(a) for a in cache.self_kv]
            x = [torch.from_numpy(a) for a in cache.cross_kv]
            past = EncoderDecoderCache(DynamicCache(list(zip(t[::2], t[1::2]))), DynamicCache(list(zip(x[::2], x[1::2]))))
        with torch.no_grad():
            out = self.model(encoder_outputs=BaseModelOutput(last_hidden_state=states),
                             attention_mask=torch.from_numpy(mask), decoder_input_ids=torch.from_numpy(tokens),
                             **cache_kwargs(self.model, past), use_cache=True, return_dict=True)
        cache_out = output_cache(out)
        self_kv = [a.numpy() for layer in cache_out.self_attention_cache.layers for a in (layer.keys, layer.values)]
        cross_kv = ([a.numpy() for layer in cache_out.cross_attention_cache.layers for a in (layer.keys, layer.values)]
                    if cache is None else cache.cross_kv)
        return out.logits[:, -1].float().numpy(), Cache(mask, self_kv, cross_kv)

    def encoder_states(self, input_ids: np.ndarray, attention_mask: np.ndarray):
        import torch

        with torch.no_grad():
            return self.model.get_encoder()(input_ids=torch.from_numpy(input_ids.astype(np.int64)),
                                            attention_mask=torch.from_numpy(attention_mask.astype(np.int64))).last_hidden_state

    def start(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> tuple[np.ndarray, Cache]:
        mask = attention_mask.astype(np.int64)
        states = self.encoder_states(input_ids, mask)
        self.width = states.shape[-1]  # the encoder's width (config names differ by family; T5Gemma nests it)
        first = np.full((len(input_ids), 1), self.start_token, dtype=np.int64)
        return self._run(first, mask, states, None)

    def step(self, tokens: np.ndarray, cache: Cache) -> tuple[np.ndarray, Cache]:
        import torch

        # the cross cache is filled: the encoder states are not read, only their shape (as in the export)
        states = torch.zeros(*cache.mask.shape, self.width)
        return self._run(tokens.astype(np.int64), cache.mask, states, cache)
