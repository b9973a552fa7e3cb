"""Step runners for decoders: ONNX Runtime (with IO binding) and PyTorch, one interface.

``runner.forward(ids, state)`` runs ``ids`` (batch x new tokens) after the cached ``state`` and
returns ``(logits, new_state)``; ``state=None`` starts a sequence. With the cache, step 0 feeds the
prompt with a zero-length past and each later step one token; without it (``use_cache=False`` in
:mod:`.generate`), every step feeds the whole sequence again with an empty past, which is the
recomputation the cache exists to avoid. Both runners count the tokens they push through the model
(``tokens_processed``), so tests can check the mechanics without timing anything.

IO binding: the ``present`` outputs of one step are bound as the ``past`` inputs of the next as
ONNX Runtime ``OrtValue`` objects, so the cache never round-trips through numpy between steps.
Without it, ``session.run`` hands every present tensor back as a new numpy array and the next step
wraps it again. ORT's fused GPT-2 ``Attention`` still writes a new ``present`` (past + new token)
each step. ``GroupQueryAttention`` graphs instead get one preallocated buffer per past/present pair
(:class:`SharedCache`), bound as both input and output: ORT's kernel sees the same pointer
(``past_present_share_buffer``) and writes only the new positions, at the offset it reads from
``seqlens_k`` (the builder's graph derives it from ``attention_mask``), instead of zeroing and
copying the whole cache into a fresh present every step. Such a state is updated in place, so
decoding from it is linear: a state may be forwarded again (each time the same positions are
rewritten), but one whose positions a later step overwrote refuses to run (``StaleStateError``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from xformopt.errors import InputError
from xformopt.models.cache_names import cache_kwargs, output_cache
from xformopt.models.quiet import load_quietly
from xformopt.runtime.session import DECODER_SPIN_US, ort_session

STACKED, SPLIT = "stacked", "split"
_ORT_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int8)": np.int8}


@dataclass(frozen=True)
class CacheLayout:
    """How a graph takes its KV cache (see the package docstring)."""

    kind: str
    past_names: tuple[str, ...]
    present_names: tuple[str, ...]
    past_shapes: tuple[tuple, ...]  # symbolic shapes from the graph (str for dynamic axes)
    num_layers: int
    has_position_ids: bool
    has_attention_mask: bool
    past_dtype: Any = np.float32  # an int8 KV cache (GroupQueryAttention's kv_cache_bit_width 8) takes int8

    @classmethod
    def from_session(cls, session) -> CacheLayout:
        inputs = {i.name: i for i in session.get_inputs()}
        outputs = [o.name for o in session.get_outputs()]
        if "past_0" in inputs:
            kind = STACKED
            past = [n for n in inputs if n.startswith("past_")]
            past.sort(key=lambda n: int(n.split("_")[1]))
            present = [f"present_{n.split('_')[1]}" for n in past]
        elif any(n.startswith("past_key_values.") for n in inputs):
            # key/value per layer; a linear-attention layer (Qwen3.5) has conv/recurrent states instead
            kind = SPLIT
            order = {"key": 0, "value": 1, "conv": 2, "recurrent": 3}
            past = sorted((n for n in inputs if n.startswith("past_key_values.")),
                          key=lambda n: (int(n.split(".")[1]), order.get(n.split(".")[2], 4)))
            present = ["present." + n.removeprefix("past_key_values.") for n in past]
        else:
            raise InputError(
                "the ONNX graph takes no past key/values (no past_0 or past_key_values.0.key input); "
                "export the decoder with `xformopt export MODEL -o DIR` (text-generation exports the KV cache)"
            )
        missing = [n for n in present if n not in outputs]
        if missing or "logits" not in outputs:
            raise InputError(f"the ONNX graph lacks outputs {missing or ['logits']}; re-export the decoder")
        return cls(
            kind=kind,
            past_names=tuple(past),
            present_names=tuple(present),
            past_shapes=tuple(tuple(inputs[n].shape) for n in past),
            num_layers=len(past) if kind == STACKED else len({n.split(".")[1] for n in past}),
            has_position_ids="position_ids" in inputs,
            has_attention_mask="attention_mask" in inputs,
            past_dtype=_ORT_TYPES.get(inputs[past[0]].type, np.float32) if past else np.float32,
        )

    def empty_past(self, batch: int) -> dict[str, np.ndarray]:
        """Zero-length past tensors: what step 0 (the prompt) is fed."""
        out = {}
        for name, shape in zip(self.past_names, self.past_shapes):
            dims = list(shape)
            batch_axis, length_axis = (1, 3) if self.kind == STACKED else (0, 2)
            dims[batch_axis] = batch
            if not is_state(name):  # a recurrent layer's state has a fixed size: zeros, not zero-length
                dims[length_axis] = 0
            if self.kind == STACKED:
                dims[0] = 2
            if any(not isinstance(d, int) for d in dims):
                raise InputError(f"cannot size the empty past for {name}: shape {shape} has unknown static axes")
            out[name] = np.zeros(dims, dtype=self.past_dtype)
        return out


def is_state(past_name: str) -> bool:
    """A linear-attention layer's fixed-size state (``past_key_values.{i}.conv`` / ``.recurrent``)."""
    return past_name.endswith((".conv", ".recurrent"))


def position_ids_for(mask: np.ndarray, new_tokens: int) -> np.ndarray:
    """Positions of the last ``new_tokens`` columns, counting only unpadded tokens (as transformers'
    generate does for left-padded batches)."""
    positions = np.cumsum(mask, axis=-1) - 1
    positions = np.where(mask == 0, 1, positions)
    return positions[:, -new_tokens:].astype(np.int64)


class StaleStateError(RuntimeError):
    """A decode state whose shared cache positions were overwritten by a later step."""


@dataclass(eq=False)  # a buffer: identity, not value, equality
class SharedCache:
    """One buffer per past/present pair, ``capacity`` positions long, that GroupQueryAttention
    updates in place. ``arrays`` own the memory; ``values`` are OrtValues viewing it (no copy).
    ``writes`` logs the first position each step wrote, so a state can tell whether a later step
    overwrote part of its prefix."""

    arrays: dict[str, np.ndarray]
    values: dict[str, Any]
    capacity: int
    writes: list[int] = field(default_factory=list)
    binding: Any = None  # the session's IOBinding with these buffers bound (made by the first step)

    @classmethod
    def allocate(cls, names, shapes, batch: int, capacity: int, dtype=np.float32) -> SharedCache:
        import onnxruntime as ort

        arrays = {}
        for name, shape in zip(names, shapes):
            dims = [batch, shape[1], capacity, shape[3]]
            if any(not isinstance(d, int) for d in dims):
                raise InputError(f"cannot size the KV cache for {name}: shape {shape} has unknown static axes")
            arrays[name] = np.zeros(dims, dtype=dtype)
        return cls(arrays, {n: ort.OrtValue.ortvalue_from_numpy(a) for n, a in arrays.items()}, capacity)


@dataclass
class State:
    """What a runner carries between steps: the cache and the attention mask so far."""

    cache: Any
    mask: np.ndarray  # (batch, cached length)
    writes_seen: int = 0  # for a SharedCache: len(cache.writes) when this state was made

    @property
    def length(self) -> int:
        return int(self.mask.shape[1])


@dataclass
class OrtDecoder:
    """An ONNX Runtime decoder session; ``io_binding`` keeps the cache as OrtValues between steps."""

    model_dir: Path
    threads: int | None = None
    io_binding: bool = True
    share_buffer: bool | None = None  # None: on for GroupQueryAttention graphs (needs io_binding)
    growth_quantum: int = 256  # positions a shared buffer is sized and grown by
    spinning: bool = True  # intra-op workers spin between ops (runtime/session.py: DECODER_SPIN_US)
    spin_us: int | None = DECODER_SPIN_US  # at most this long before a worker sleeps (None: ORT's own count)
    tokens_processed: int = 0
    session: Any = field(init=False, repr=False)
    layout: CacheLayout = field(init=False)
    step_limit: int | None = field(init=False, default=None)  # most new tokens per graph call (step_token_limit)
    vocab: int | None = field(init=False, default=None)  # the logits' last axis, when the graph fixes it

    def __post_init__(self):
        self.model_dir = Path(self.model_dir)
        self.session = ort_session(self.model_dir / "model.onnx", self.threads, spinning=self.spinning,
                                   spin_us=self.spin_us)
        self.layout = CacheLayout.from_session(self.session)
        self.output_names = ["logits", *self.layout.present_names]
        gqa_positions = _gqa_max_positions(self.model_dir / "model.onnx")
        self.left_padding = gqa_positions is None
        if self.share_buffer is None:
            self.share_buffer = gqa_positions is not None and self.io_binding
        if self.share_buffer and (gqa_positions is None or not self.io_binding):
            raise InputError(f"{self.model_dir}: a shared KV buffer needs a GroupQueryAttention graph and io_binding")
        self.max_positions = gqa_positions
        self.step_limit = step_token_limit(self.layout)
        vocab = next(o.shape[-1] for o in self.session.get_outputs() if o.name == "logits")
        self.vocab = vocab if isinstance(vocab, int) and vocab > 0 else None  # None: symbolic in the graph

    padding_note = ("GroupQueryAttention takes the rotary positions from the sequence lengths (no position_ids): "
                    "left-padded batches are not supported, batch rows must be unpadded")

    def forward(self, ids: np.ndarray, state: State | None = None, mask: np.ndarray | None = None,
                use_cache: bool = True, last_only: bool = False):
        """Logits (batch, len(ids), vocab) for ``ids`` after ``state``; ``mask`` covers past + ids
        (default: all ones). Returns (logits, new state). The graph always returns its present
        tensors and the logits of every new position; ``use_cache=False`` only means the caller will
        not feed the presents back, and ``last_only`` is accepted for symmetry with PyTorch."""
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        batch, new = ids.shape
        if mask is None:
            previous = state.mask if state is not None else np.zeros((batch, 0), dtype=np.int64)
            mask = np.concatenate([previous, np.ones((batch, new), dtype=np.int64)], axis=1)
        mask = np.ascontiguousarray(mask, dtype=np.int64)
        if not self.left_padding and not mask.all():
            raise InputError(f"{self.model_dir}: {self.padding_note}")
        feed = {"input_ids": ids}
        if self.layout.has_attention_mask:
            feed["attention_mask"] = mask
        if self.layout.has_position_ids:
            feed["position_ids"] = np.ascontiguousarray(position_ids_for(mask, new))
        if self.step_limit and new > self.step_limit:
            return self._forward_in_pieces(ids, state, mask, use_cache)
        self.tokens_processed += ids.size
        if self.share_buffer and use_cache:
            return self._forward_shared(feed, state, mask)
        past = state.cache if state is not None else self.layout.empty_past(batch)
        if isinstance(past, SharedCache):
            past = self._trimmed(past, state.length)
        if self.io_binding:
            binding = self.session.io_binding()
            for name, value in feed.items():
                binding.bind_cpu_input(name, value)
            for name in self.layout.past_names:
                value = past[name]
                if isinstance(value, np.ndarray):
                    binding.bind_cpu_input(name, value)
                else:
                    binding.bind_ortvalue_input(name, value)
            for name in self.output_names:
                binding.bind_output(name, "cpu")
            self.session.run_with_iobinding(binding)
            outputs = binding.get_outputs()
            logits = outputs[0].numpy()
            cache = dict(zip(self.layout.past_names, outputs[1:]))
        else:
            outputs = self.session.run(self.output_names, {**feed, **past})
            logits = outputs[0]
            cache = dict(zip(self.layout.past_names, outputs[1:]))
        return logits, State(cache, mask)

    def _forward_in_pieces(self, ids: np.ndarray, state: State | None, mask: np.ndarray, use_cache: bool):
        """``ids`` in steps of at most ``step_limit`` tokens, each after the state the previous one left."""
        past = state.length if state is not None else 0
        logits = []
        for start in range(0, ids.shape[1], self.step_limit):
            end = min(start + self.step_limit, ids.shape[1])
            out, state = self.forward(ids[:, start:end], state, mask[:, : past + end], use_cache)
            logits.append(out)
        return np.concatenate(logits, axis=1), state

    def _forward_shared(self, feed: dict, state: State | None, mask: np.ndarray):
        """One step into the shared buffers: bound as both past and present, so ORT writes only
        the new positions; a new, larger buffer only when the sequence outgrows this one."""
        past_len = state.length if state is not None else 0
        total = mask.shape[1]
        cache = state.cache if state is not None else None
        if cache is not None and any(start < past_len for start in cache.writes[state.writes_seen:]):
            raise StaleStateError(f"this decode state ({past_len} tokens) was overwritten by a later step "
                                  "on the same shared KV buffer; decode from the newest state")
        if cache is None or total > cache.capacity:
            cache = self._grown(cache, past_len, feed["input_ids"].shape[0], total)
        binding = cache.binding
        if binding is None:
            # Bound once per buffer: the cache is the same OrtValues every step, so only the step's
            # own inputs and the logits are bound again (2 x num_layers fewer bind calls per token).
            binding = cache.binding = self.session.io_binding()
            binding.bind_output("logits", "cpu")  # first: get_outputs()[0] is the logits
            for past_name, present_name in zip(self.layout.past_names, self.layout.present_names):
                binding.bind_ortvalue_input(past_name, cache.values[past_name])
                binding.bind_ortvalue_output(present_name, cache.values[past_name])
        for name, value in feed.items():  # ``feed`` keeps these arrays alive through the run
            binding.bind_cpu_input(name, value)
        ids = feed["input_ids"]
        if self.vocab:  # ORT writes the logits straight into a new array of ours: no get_outputs(),
            # which wraps all 1 + 2 x num_layers outputs in Python objects every step
            logits = np.empty((*ids.shape, self.vocab), dtype=np.float32)
            binding.bind_output("logits", "cpu", 0, np.float32, list(logits.shape), logits.ctypes.data)
        else:
            binding.bind_output("logits", "cpu")  # a fresh logits tensor: this step's shape
        self.session.run_with_iobinding(binding)
        cache.writes.append(past_len)
        if not self.vocab:
            logits = binding.get_outputs()[0].numpy()
        return logits, State(cache, mask, len(cache.writes))

    def _grown(self, old: SharedCache | None, keep: int, batch: int, total: int) -> SharedCache:
        # Headroom (at least one quantum, doubling) so a growing sequence reallocates
        # O(log n) times; never past the graph's rotary table, which bounds the context anyway.
        quantum = self.growth_quantum
        capacity = -(-(total + max(total, quantum)) // quantum) * quantum
        capacity = max(total, min(capacity, self.max_positions or capacity))
        cache = SharedCache.allocate(self.layout.past_names, self.layout.past_shapes, batch, capacity,
                                     self.layout.past_dtype)
        if old is not None:
            for name, array in cache.arrays.items():
                array[:, :, :keep] = old.arrays[name][:, :, :keep]
        return cache

    @staticmethod
    def _trimmed(cache: SharedCache, length: int) -> dict[str, np.ndarray]:
        return {n: np.ascontiguousarray(a[:, :, :length]) for n, a in cache.arrays.items()}

    @staticmethod
    def cache_arrays(state: State) -> dict[str, np.ndarray]:
        """The cache as numpy arrays, ``state.length`` positions long (for tests and parity checks)."""
        if isinstance(state.cache, SharedCache):
            return OrtDecoder._trimmed(state.cache, state.length)
        return {k: (v if isinstance(v, np.ndarray) else v.numpy()) for k, v in state.cache.items()}


# transformers' reference Gated DeltaNet (torch_chunk_gated_delta_rule) runs over chunks of 64 tokens in a
# Python loop, which the dynamo export unrolls for the one chunk its sample needs: the graph takes at most
# 64 new tokens a call, so longer prompts are fed in pieces (the states carry over exactly).
LINEAR_ATTENTION_CHUNK = 64


def step_token_limit(layout: CacheLayout) -> int | None:
    """The most new tokens one call of the graph takes: a linear-attention layer's chunk when the graph
    carries such states (only the dynamo export writes them), else None."""
    return LINEAR_ATTENTION_CHUNK if any(is_state(n) for n in layout.past_names) else None


def _gqa_max_positions(model_path: Path) -> int | None:
    """None for graphs without GroupQueryAttention; else the rows of its rotary cos table (the
    longest context it can take), or 0 when that table is not a plain initializer."""
    import onnx

    graph = onnx.load(model_path, load_external_data=False).graph
    node = next((n for n in graph.node if n.op_type == "GroupQueryAttention"), None)
    if node is None:
        return None
    cos = node.input[7] if len(node.input) > 7 else ""
    return next((int(i.dims[0]) for i in graph.initializer if i.name == cos and i.dims), 0)


class TorchDecoder:
    """The PyTorch baseline behind the same interface (transformers' own cache, DynamicCache)."""

    def __init__(self, model_dir: Path | None = None, threads: int | None = None, model=None,
                 trust_remote_code: bool = False):
        import torch

        if threads:
            torch.set_num_threads(threads)
        if model is None:
            from transformers import AutoModelForCausalLM

            model = load_quietly(AutoModelForCausalLM.from_pretrained, model_dir, trust_remote_code=trust_remote_code).eval()
        self.model = model
        self.tokens_processed = 0
        self._torch = torch

    def forward(self, ids: np.ndarray, state: State | None = None, mask: np.ndarray | None = None,
                use_cache: bool = True, last_only: bool = False):
        """As :meth:`OrtDecoder.forward`; ``use_cache=False`` builds no cache at all (the no-cache
        baseline) and ``last_only`` computes only the last position's logits (``logits_to_keep=1``),
        as transformers' ``generate`` does."""
        torch = self._torch
        ids = np.asarray(ids, dtype=np.int64)
        batch, new = ids.shape
        if mask is None:
            previous = state.mask if state is not None else np.zeros((batch, 0), dtype=np.int64)
            mask = np.concatenate([previous, np.ones((batch, new), dtype=np.int64)], axis=1)
        self.tokens_processed += ids.size
        with torch.inference_mode():
            out = self.model(
                input_ids=torch.from_numpy(ids),
                attention_mask=torch.from_numpy(np.ascontiguousarray(mask, dtype=np.int64)),
                position_ids=torch.from_numpy(position_ids_for(mask, new)),
                **cache_kwargs(self.model, state.cache if state is not None else None),
                use_cache=use_cache,
                **({"logits_to_keep": 1} if last_only else {}),
            )
        return out.logits.float().numpy(), State(output_cache(out) if use_cache else None, mask)
