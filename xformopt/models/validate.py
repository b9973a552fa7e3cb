"""Checks that run before any work: a model folder a pass could only choke on minutes later, and
the thread count. Each problem is one InputError line naming the file and the fix.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

from xformopt import tasks
from xformopt.errors import InputError
from xformopt.measure import host as host_facts
from xformopt.models import pruned_heads, weight_coverage
from xformopt.onnx_graph import SEQ2SEQ_GRAPHS, seq2seq_stage

# config keys each family needs (the first present of each alternative group), all positive ints:
# the ones xformopt itself reads (width, heads, layers). Others transformers defaults when absent;
# when present they are typed below (OPTIONAL_TYPES), and the shapes they imply are compared with
# the weights (check_config_matches_weights).
MAX_DIM = 1 << 20  # no real transformer has a width, head count or layer count near this


def read_config(path: Path) -> dict:
    """config.json as a dict: UTF-8, valid JSON, an object."""
    file = Path(path) / "config.json"
    try:
        text = file.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{file}: not UTF-8 text (byte {exc.start}); re-save the config with save_pretrained()") from None
    except OSError as exc:
        raise InputError(f"cannot read {file} ({exc.strerror or type(exc).__name__})") from None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{file} is not valid JSON ({exc.msg}, line {exc.lineno}); re-save it with save_pretrained()") from None
    except (RecursionError, ValueError) as exc:
        raise InputError(f"{file} is not a usable config ({type(exc).__name__}: nested too deep or a number too long)") from None
    if not isinstance(config, dict):
        raise InputError(f"{file} is a JSON {type(config).__name__}, not an object; a Hugging Face config.json "
                         "is an object with model_type, hidden_size, ...")
    return config


# Optional keys the code or transformers reads, with the kind each must be when present.
OPTIONAL_TYPES = {
    "architectures": "a list of class names", "hidden_act": "a name such as \"gelu\"",
    "vocab_size": "a positive whole number", "max_position_embeddings": "a positive whole number",
    "n_positions": "a positive whole number", "n_ctx": "a positive whole number",
    "intermediate_size": "a positive whole number", "hidden_dim": "a positive whole number",
    "n_inner": "a positive whole number", "type_vocab_size": "a positive whole number",
    "pad_token_id": "a whole number", "bos_token_id": "a whole number", "eos_token_id": "a whole number",
    "layer_norm_eps": "a positive number", "layer_norm_epsilon": "a positive number",
    "num_labels": "a positive whole number", "problem_type": "a name such as \"single_label_classification\"",
    "pruned_heads": "an object of layer -> head list", "num_key_value_heads": "a positive whole number",
    "rms_norm_eps": "a positive number", "tie_word_embeddings": "true or false",
}


# Keys a family may set to 0 where OPTIONAL_TYPES wants them positive (DeBERTa-v3: no token type
# embeddings, type_vocab_size 0; optimum then exports no token_type_ids input).
ZERO_ALLOWED = {"deberta-v2": {"type_vocab_size"}}


def _of_kind(value, kind: str) -> bool:
    if kind.startswith("a list"):
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if kind.startswith("a name"):
        return isinstance(value, str)
    if kind == "a positive whole number":
        return _positive_int(value)
    if kind == "a whole number":
        return (isinstance(value, int) and not isinstance(value, bool) and 0 <= value < (1 << 31)) or (
            isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value))
    if kind == "a positive number":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and 0 < value < 1
    if kind.startswith("an object"):
        return isinstance(value, dict)
    if kind == "true or false":
        return isinstance(value, bool)
    return True


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= (1 << 31)


def check_config(config: dict, file: Path, family) -> None:
    """The shape keys ``family`` (xformopt.families.Family) reads, with sane types, and a label mapping of integer ids."""
    for group in (family.hidden_keys, family.heads_keys, family.layers_keys):
        present = family.config_item(config, group)  # nested encoder configs (T5Gemma) included
        if present is None:
            raise InputError(f"{file}: {family.model_type} config lacks {' or '.join(group)}; re-save it with save_pretrained()")
        key, value = present
        if not _positive_int(value) or value > MAX_DIM:
            raise InputError(f"{file}: {key} must be a positive whole number (got {value!r})")
    for key, kind in OPTIONAL_TYPES.items():
        if key in ZERO_ALLOWED.get(family.model_type, ()) and type(config.get(key)) is int and config[key] == 0:
            continue
        if key in config and config[key] is not None and not _of_kind(config[key], kind):
            raise InputError(f"{file}: {key} is {config[key]!r}; it must be {kind}")
    width, heads = family.config_value(config, family.hidden_keys), family.config_value(config, family.heads_keys)
    head_dim = family.config_item(config, family.head_dim_keys)
    if head_dim is not None:  # the head's own width: the attention is heads x head_dim, whatever the hidden size
        if not _positive_int(head_dim[1]) or head_dim[1] > MAX_DIM:
            raise InputError(f"{file}: {head_dim[0]} must be a positive whole number (got {head_dim[1]!r})")
    elif width % heads:
        raise InputError(f"{file}: hidden size {width} is not a multiple of the {heads} attention heads")
    for key in ("label2id", "id2label"):
        mapping = config.get(key)
        if mapping is None:
            continue
        if not isinstance(mapping, dict):
            raise InputError(f"{file}: {key} must be an object (got a {type(mapping).__name__})")
        for name, value in mapping.items():
            label_id = value if key == "label2id" else name
            if key == "id2label" and isinstance(label_id, str) and label_id.strip().lstrip("-").isdigit():
                label_id = int(label_id)
            if not isinstance(label_id, int) or isinstance(label_id, bool) or not 0 <= label_id < (1 << 31):
                raise InputError(f"{file}: {key} maps {name!r} to {value!r}; class ids must be whole numbers "
                                 f"from 0 (e.g. \"label2id\": {{\"negative\": 0, \"positive\": 1}})")
            if key == "id2label" and not isinstance(value, str):
                raise InputError(f"{file}: id2label maps {name!r} to {value!r}; label names must be strings")


def check_safetensors(file: Path) -> dict[str, list[int]]:
    """The header parses and every tensor's bytes lie inside the file (a truncated download does not).

    Read by hand (8-byte length + JSON) rather than with safetensors.safe_open, to name what is wrong
    (header vs. truncation) in the one line and not map gigabytes just to check it."""
    size = file.stat().st_size
    try:
        with open(file, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise ValueError("shorter than its 8-byte header length")
            (n,) = struct.unpack("<Q", head)
            if n > min(size - 8, 100 << 20):
                raise ValueError(f"header length {n} exceeds the file")
            header = json.loads(fh.read(n).decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise InputError(f"{file}: not a readable safetensors file ({exc}); re-download or re-save the weights") from None
    if not isinstance(header, dict):
        raise InputError(f"{file}: safetensors header is not an object; re-download or re-save the weights")
    end = 0
    shapes = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            raise InputError(f"{file}: tensor {name!r} has no valid data_offsets; re-download or re-save the weights")
        end = max(end, offsets[1])
        shapes[name] = info.get("shape")
    if 8 + n + end > size:
        raise InputError(f"{file} is truncated ({size} bytes, its header needs {8 + n + end}); "
                         "re-download or re-save the weights")
    return shapes


def check_weights(path: Path) -> dict[str, list[int] | None]:
    """The weights exist and are readable; returns the tensors transformers would load, with their
    shapes (None for those of a sharded .bin)."""
    path = Path(path)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            doc = json.loads(index.read_text(encoding="utf-8"))
            shards = sorted(set(doc["weight_map"].values()))
            # transformers reads "metadata" too (KeyError otherwise), and a shard is a file of this
            # folder: a name with a path part would load weights from elsewhere.
            if not (isinstance(doc["metadata"], dict) and all(isinstance(s, str) and s == Path(s).name
                                                               and s not in (".", "..") for s in shards)):
                raise ValueError("metadata or shard names")
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
            raise InputError(f"{index} is not a valid shard index; re-save the model with save_pretrained()") from None
        held = {}
        for shard in shards:
            if not (path / shard).is_file():
                raise InputError(f"{path / shard} (listed in {index.name}) is missing; re-download the model")
            held[shard] = check_safetensors(path / shard)
        # transformers loads the tensors the index lists, from the shard it names, and no others
        shapes = {}
        for name, shard in doc["weight_map"].items():
            if name not in held[shard]:
                raise InputError(f"{index} puts {name} in {shard}, which does not hold it; re-download the model "
                                 "or re-save it with save_pretrained()")
            shapes[name] = held[shard][name]
        return shapes
    if (path / "model.safetensors").is_file():
        return check_safetensors(path / "model.safetensors")
    if (path / "pytorch_model.bin").is_file():
        return check_torch_bin(path / "pytorch_model.bin")
    if (path / "pytorch_model.bin.index.json").is_file():
        return bin_index_names(path / "pytorch_model.bin.index.json")
    raise InputError(f"{path} has no weights (model.safetensors or pytorch_model.bin); "
                     "save the model with save_pretrained()")


def bin_index_names(index: Path) -> dict[str, None]:
    """The tensors a sharded .bin checkpoint lists (shapes unknown: reading them means unpickling every shard)."""
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        if not (isinstance(weight_map, dict) and all(isinstance(v, str) and v == Path(v).name for v in weight_map.values())):
            raise ValueError("weight_map")
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        raise InputError(f"{index} is not a valid shard index; re-download or re-save the weights") from None
    for shard in sorted(set(weight_map.values())):
        if not (index.parent / shard).is_file():
            raise InputError(f"{index.parent / shard} (listed in {index.name}) is missing; re-download the model")
    return dict.fromkeys(weight_map)


def check_torch_bin(file: Path) -> dict[str, list[int]]:
    """A pickled checkpoint must load with weights_only=True (plain tensors, no code); returns shapes.

    mmap: the tensors are mapped, not read, so this costs a header walk, not the model's size."""
    import torch

    if file.stat().st_size == 0:
        raise InputError(f"{file} is empty; re-download or re-save the weights")
    try:
        state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # UnpicklingError (a pickle with code or other objects), RuntimeError (not a zip), ...
        import pickle

        why = ("it pickles objects other than tensors, which are never run" if isinstance(exc, pickle.UnpicklingError)
               else f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:80]}")
        raise InputError(f"{file} cannot be loaded as plain weights with torch.load(weights_only=True) ({why}); "
                         "re-save the model as safetensors with save_pretrained()") from None
    if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
        raise InputError(f"{file} is not a state dict of tensors; re-save the model with save_pretrained()")
    return {name: list(t.shape) for name, t in state.items()}


# Files a saved tokenizer keeps its vocabulary in; transformers 5 builds an empty tokenizer (special tokens
# only) for a folder that has none of them, instead of failing.
VOCABULARY_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "tokenizer.model", "spiece.model",
                    "sentencepiece.bpe.model", "source.spm")


def check_tokenizer(path: Path, trust_remote_code: bool = False) -> None:
    from transformers import AutoTokenizer

    if not any((Path(path) / name).is_file() for name in VOCABULARY_FILES):
        raise InputError(f"{path}: the tokenizer cannot be loaded (no tokenizer.json or vocabulary file); save the model's tokenizer "
                         "into it with tokenizer.save_pretrained()")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, use_fast=True, trust_remote_code=trust_remote_code)
    except Exception as exc:  # transformers raises OSError, ValueError, TypeError, ... for broken files
        raise InputError(f"{path}: the tokenizer cannot be loaded ({type(exc).__name__}); the folder needs "
                         "tokenizer.json (or vocab files) saved with the model's tokenizer.save_pretrained()") from None
    if not tokenizer.is_fast:
        raise InputError(f"{path} has no fast (Rust) tokenizer (tokenizer.json); xformopt needs one")
    limit = tokenizer.model_max_length
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InputError(f"{path / 'tokenizer_config.json'}: model_max_length is {limit!r}; it must be a positive "
                         "whole number (or absent)")


def check_model_files(path: Path, *, task: str | None = None, trust_remote_code: bool = False) -> None:
    """After sources.resolve checked config.json: the weights (a PyTorch folder; an ONNX stage folder
    carries model.onnx instead), that the config builds a model whose shapes match them, and the
    tokenizer, before any pass runs."""
    path = Path(path)
    if (path / "model.onnx").is_file():
        check_onnx_file(path / "model.onnx")
    elif seq2seq_stage(path):  # an encoder-decoder stage: its two graphs
        for name in SEQ2SEQ_GRAPHS:
            check_onnx_file(path / name)
    else:
        shapes = check_weights(path)
        if task is not None and not trust_remote_code:
            check_config_matches_weights(path, task, shapes)
    check_tokenizer(path, trust_remote_code)


def check_config_matches_weights(path: Path, task: str, shapes: dict[str, list[int]]) -> None:
    """Build the model from config.json on the meta device (no memory, no weights read) and compare
    its parameter shapes with the checkpoint's: a config edited after saving (another width, an
    activation that does not exist) fails here in one line, not minutes later inside export."""
    import torch
    import transformers
    from transformers import AutoConfig

    file = Path(path) / "config.json"
    cls = getattr(transformers, tasks.get(task).auto_model)
    try:
        config = AutoConfig.from_pretrained(path)
        heads = pruned_heads.recorded(config)  # a head-pruned stage: built whole, then its heads pruned
        pruned_heads.store(config, {})
        with torch.device("meta"):
            model = cls.from_config(config)
            if heads:
                pruned_heads.prune_heads(model, heads)
    except Exception as exc:  # transformers raises KeyError, ValueError, TypeError, ... for odd configs
        raise InputError(f"{file}: no {task} model can be built from this config ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0][:160] if str(exc) else 'invalid value'}); "
                         "re-save it with save_pretrained()") from None
    expected = {name: list(t.shape) for name, t in model.state_dict().items()}
    prefix = getattr(model, "base_model_prefix", "") or ""
    found = {c for name in shapes for c in (name, f"{prefix}.{name}", name.removeprefix(f"{prefix}.")) if c in expected}
    if not found:  # e.g. a header with no tensors: every weight would be random, and parity fails late (exit 3)
        raise InputError(f"{path} holds none of the weights its config.json builds (checkpoint tensors: "
                         f"{len(shapes)}); re-save the model with save_pretrained()")
    for name, shape in shapes.items():
        for candidate in (name, f"{prefix}.{name}", name.removeprefix(f"{prefix}.")):
            if candidate in expected:
                if shape is not None and list(shape) != expected[candidate]:
                    raise InputError(f"{file} does not match the weights: {name} is {list(shape)} in the checkpoint "
                                     f"but the config builds {expected[candidate]}; use the config saved with "
                                     "these weights")
                break
    check_complete(model, path, task, shapes)


def check_complete(model, path: Path, task: str, shapes: dict) -> None:
    """Every tensor MODEL needs is in the checkpoint, but a task head the task starts afresh: the
    ones transformers would fill at random (a shard index listing only some tensors, a truncated
    conversion) refused by name."""

    lacking = weight_coverage.missing(model, shapes)
    fresh = weight_coverage.fresh_head(model, shapes, head_may_be_fresh=tasks.get(task).head_may_be_fresh)
    lacking = [name for name in lacking if name not in fresh]
    if not lacking:
        return
    index = next((f for f in ("model.safetensors.index.json", "pytorch_model.bin.index.json")
                  if (Path(path) / f).is_file()), None)
    single = next((f for f in ("model.safetensors", "pytorch_model.bin") if (Path(path) / f).is_file()), "")
    source = f"{Path(path) / index} does not list" if index else f"{Path(path) / single} lacks"
    raise InputError(f"{source} {len(lacking)} tensor(s) the {task} model needs, which transformers would fill "
                     f"with random values: {weight_coverage.shown(lacking)}; re-download the model or re-save it "
                     "with save_pretrained()")


def check_threads(threads: int | None, flag: str = "--threads") -> None:
    """More intra-op threads than the process may run oversubscribes the host (thousands of
    threads hang it): refused, naming the limit."""
    if threads is None:
        return
    limit = host_facts.usable_cpus()
    if threads > limit:
        raise InputError(f"{flag} {threads} is more than the {limit} CPU(s) this process may use "
                         f"(affinity mask and cgroup quota); pass --threads {limit} or fewer")


def check_onnx_file(model: Path) -> None:
    """A model.onnx that parses and holds a graph (onnx parses a 0-byte file as an empty model)."""
    model = Path(model)
    if model.stat().st_size == 0:
        raise InputError(f"{model} is empty (0 bytes); re-export it")
    try:
        import onnx

        proto = onnx.load(str(model), load_external_data=False)
    except Exception as exc:  # onnx raises DecodeError, ValueError, ... for a damaged file
        raise InputError(f"{model} is not a valid ONNX model ({type(exc).__name__}); re-export it") from None
    if not proto.graph.node or not proto.graph.output:
        raise InputError(f"{model} holds no graph (no nodes or outputs); re-export it")
