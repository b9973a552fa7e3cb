"""Model surgery shared by prune and distill: where a family's prunable pieces live (its row's
module paths, ``xformopt.families.Layout``), the shape they have now, cutting a model to a plan, and
the weights' hash a record carries."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from xformopt.families import Layout, layout_of
from xformopt.models import pruned_heads
from xformopt.passes.prune.flops import Shape
from xformopt.passes.prune.plans import Plan


@dataclass
class Arch:
    """Where the prunable pieces of one family live: its row's module paths (xformopt.families.Layout)."""

    layout: Layout

    def layers(self, model):
        return Layout.get(model.base_model, self.layout.layers)

    def set_layers(self, model, modules) -> None:
        import torch

        Layout.set(model.base_model, self.layout.layers, torch.nn.ModuleList(modules))
        setattr(model.config, self.layout.layers_key, len(modules))
        if self.layout.layer_count_attr:
            Layout.set(model.base_model, self.layout.layer_count_attr, len(modules))

    def heads(self, layer) -> int:
        return Layout.get(layer, self.layout.heads)

    def head_dim(self, layer) -> int:
        return Layout.get(layer, self.layout.head_dim)

    def attn_out(self, layer):
        return Layout.get(layer, self.layout.attn_out)

    def attn_value(self, layer):
        return Layout.get(layer, self.layout.attn_value)

    def ffn_in(self, layer):
        return Layout.get(layer, self.layout.ffn_in)

    def ffn_out(self, layer):
        return Layout.get(layer, self.layout.ffn_out)

    def set_ffn(self, layer, lin_in, lin_out) -> None:
        Layout.set(layer, self.layout.ffn_in, lin_in)
        Layout.set(layer, self.layout.ffn_out, lin_out)

    def set_ffn_config(self, config, width: int) -> None:
        setattr(config, self.layout.ffn_key, width)

    def hidden(self, config) -> int:
        return getattr(config, self.layout.hidden_key)



def arch_for(model_type: str, pass_name: str = "prune") -> Arch:
    """Where ``model_type``'s prunable pieces live; an InputError naming the supported families otherwise."""
    return Arch(layout_of(model_type, pass_name))



def apply_plan(model, arch: Arch, plan: Plan) -> None:
    """Drop layers, prune heads (xformopt.models.pruned_heads: recorded in config.pruned_heads, which
    models.load_torch_model re-applies), and cut FFN rows/columns with transformers' prune_linear_layer."""
    import torch
    from transformers.pytorch_utils import prune_linear_layer

    layers = list(arch.layers(model))
    heads_to_prune: dict[int, list[int]] = {}
    for new, old in enumerate(plan.keep_layers):
        layer = layers[old]
        original_ids = pruned_heads.current_head_ids(model, old) if arch.layout.head_pruning else []
        drop = [h for p, h in enumerate(original_ids) if p not in set(plan.heads[old])]
        if drop:
            heads_to_prune[new] = drop
        keep = torch.tensor(plan.ffn[old], dtype=torch.long)
        arch.set_ffn(layer, prune_linear_layer(arch.ffn_in(layer), keep, dim=0),
                     prune_linear_layer(arch.ffn_out(layer), keep, dim=1))
    old_pruned = pruned_heads.recorded(model.config)
    arch.set_layers(model, [layers[i] for i in plan.keep_layers])
    pruned_heads.store(model.config, {new: old_pruned.get(old) for new, old in enumerate(plan.keep_layers)})
    arch.set_ffn_config(model.config, plan.ffn_width)
    if heads_to_prune:
        pruned_heads.prune_heads(model, heads_to_prune)



def current_shape(model, arch: Arch) -> Shape:
    layers = list(arch.layers(model))
    return Shape(arch.hidden(model.config), arch.head_dim(layers[0]), [arch.heads(l) for l in layers],
                 [arch.ffn_in(l).out_features for l in layers])



def weights_sha256(model) -> str:
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()

