"""ONNX Runtime sessions as every runner (encoder and decoder) opens them: explicit threads, pools
that sleep instead of spinning, and the feed of int64 inputs."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np


def ort_feed(encoded: dict, input_names) -> dict[str, np.ndarray]:
    """The int64 inputs an ONNX graph takes; a graph input the tokenizer did not return (e.g.
    token_type_ids) gets zeros."""
    feed = {name: encoded[name].astype(np.int64) for name in input_names if name in encoded}
    for name in input_names:
        feed.setdefault(name, np.zeros_like(encoded["input_ids"], dtype=np.int64))
    return feed


# A decoder's workers spin this long after each parallel section before they sleep: a decode step is
# hundreds of small ops, and waking a sleeping worker for each one cost more than the second thread gave
# (SmolLM2 int4, 2 threads: 82 tokens/s sleeping, 136 spinning at most 1000 us, 133 spinning unbounded;
# docs/results/llms.md). Bounded, so a pool left idle gives its cores back within a millisecond.
DECODER_SPIN_US = 1000


def thread_pool_setting() -> str:
    """How the thread pools wait, as this process really has it (recorded in every report)."""
    omp = os.environ.get("OMP_WAIT_POLICY", "unset: OpenMP's default, which spins")
    return (f"ONNX Runtime allow_spinning=0 (decoders: spin_duration_us={DECODER_SPIN_US}); "
            f"PyTorch OMP_WAIT_POLICY={omp}")


def ort_session(model_path: Path | bytes, threads: int | None = None, level: str = "all", disabled_optimizers=(), *,
                profile_prefix: str | None = None, optimized_path: str | None = None,
                external_data_dir: Path | None = None, spinning: bool = False, spin_us: int | None = None):
    """An ONNX Runtime CPU session with an explicit thread count (timings must be reproducible).

    ``disabled_optimizers``: ORT graph transformers to leave out, by name; ``profile_prefix``: ORT's
    profiler on, its trace written to ``<prefix>_<time>.json`` at ``end_profiling()``;
    ``optimized_path``: the graph as ORT runs it (after its own fusions) is saved there, so the trace's
    node names can be looked up. ``model_path`` may be a serialized graph (bytes) whose external weights
    lie in ``external_data_dir`` (a graph rewritten in memory over the artifact's own weights);
    ``spinning``: let idle intra-op workers spin (off by default, below), for at most ``spin_us``
    microseconds before they sleep when given (ORT's ``session.intra_op.spin_duration_us``)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if profile_prefix is not None:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    if optimized_path is not None:
        options.optimized_model_filepath = optimized_path
        # Weights beside it, not in it: a graph past 2 GB cannot be one protobuf, and only names are read back.
        options.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                         Path(optimized_path).name + ".data")
        options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
        options.log_severity_level = 3  # not the "hardware-specific optimizations" warning: the file is ours, for names
    if external_data_dir is not None:
        options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(external_data_dir))
    # Idle workers sleep instead of spin-waiting: spinning pools steal the cores that the other
    # variants of an interleaved comparison (and the tokenizer) need. Measured on a 2-core host:
    # MiniLM at batch 1 took 6.1 ms with spinning and 2.6 ms without.
    # ``spinning``: intra-op workers spin between parallel sections instead (decoders do, DECODER_SPIN_US).
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    if spinning and spin_us:
        options.add_session_config_entry("session.intra_op.spin_duration_us", str(int(spin_us)))
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    options.graph_optimization_level = {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[level]
    source = model_path if isinstance(model_path, bytes) else str(model_path)
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"],
                                disabled_optimizers=list(disabled_optimizers))
