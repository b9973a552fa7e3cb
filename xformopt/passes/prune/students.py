"""Untrained students of explicit shapes, for timing before any training: the teacher cut to each shape with
data-free (magnitude) importance. Their weights are not the trained student's, but their graphs are the same
shape, so they time as the trained student will (the shape search orders its candidates by them)."""

from __future__ import annotations

import copy

import numpy as np

from xformopt.passes.prune import width as width_prune
from xformopt.passes.prune.importance import magnitude_importance
from xformopt.passes.prune.plans import explicit_plan, shared_head_scores
from xformopt.passes.prune.relative import resolve
from xformopt.passes.surgery import Arch, apply_plan, current_shape


def cut_to(model, arch: Arch, options, multiple: int, scores=None):
    """A copy of ``model`` cut to the explicit shape ``options`` (absolute or fractions; prune's options model),
    by ``scores`` (head, FFN, layer, channel importance; default: magnitude). ``model`` is left as it was."""
    shape = current_shape(model, arch)
    options = resolve(options, shape)
    width_prune.check_width_target(options.hidden_size, options.heads_per_layer, shape.head_dim)
    if scores is None:
        heads, ffn, layers = magnitude_importance(model, arch)
        channels = width_prune.magnitude_channels(model, arch) if options.hidden_size is not None else None
        scores = (heads, ffn, layers, channels)
    heads, ffn, layers, channels = scores
    if arch.layout.shared_head_bias:  # MPNet: one per-head bias for every layer, so one head ranking for all
        heads = shared_head_scores(heads)
    plan = explicit_plan(heads, ffn, layers, shape, options, multiple,
                         None if channels is None else np.asarray(channels))
    student = copy.deepcopy(model)
    apply_plan(student, arch, plan)
    if plan.hidden is not None and len(plan.hidden) < shape.hidden:
        student = width_prune.shrink_hidden(student, arch, plan.hidden)
    return student.eval()
