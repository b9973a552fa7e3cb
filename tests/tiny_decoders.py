"""Tiny grouped-query decoders of every builder family, built in code (tests only).

Each is 2 layers, 64 wide, 4 query heads sharing 2 KV heads (num_key_value_heads < num_attention_heads),
with the family's own quirks: Qwen2's q/k/v biases, Qwen3's per-head q/k RMSNorms, Mistral's sliding
window, Phi-3's fused qkv/gate-up projections.
"""

from __future__ import annotations

CONTEXT = 128
SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=CONTEXT, tie_word_embeddings=False)


def make_config(family: str):
    import transformers

    classes = {"llama": "LlamaConfig", "qwen2": "Qwen2Config", "qwen3": "Qwen3Config", "mistral": "MistralConfig",
               "phi3": "Phi3Config", "ministral3": "Ministral3Config", "gemma4_text": "Gemma4TextConfig",
               "qwen3_5_text": "Qwen3_5TextConfig", "granite": "GraniteConfig"}
    extra = {"qwen3": {"head_dim": 16}, "mistral": {"sliding_window": None}, "phi3": {"pad_token_id": 0, "original_max_position_embeddings": CONTEXT},
             "ministral3": {"head_dim": 16, "pad_token_id": 0},
             # one sliding (window 8, shorter than the parity prompts) and one full-attention layer, whose
             # head_dim (global_head_dim) differs; per-layer input embeddings as Gemma 4 ships them
             "gemma4_text": {"head_dim": 16, "global_head_dim": 32, "layer_types": ["sliding_attention", "full_attention"],
                             "sliding_window": 8, "hidden_size_per_layer_input": 16, "pad_token_id": 0},
             # one Gated DeltaNet (linear attention) layer and one full-attention layer
             "qwen3_5_text": {"head_dim": 16, "layer_types": ["linear_attention", "full_attention"],
                              "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_num_key_heads": 2,
                              "linear_num_value_heads": 4, "pad_token_id": 0}}

    def build(vocab_size: int, eos_id: int):
        cls = getattr(transformers, classes[family])
        more = {"vocab_size_per_layer_input": vocab_size} if family == "gemma4_text" else {}
        return cls(vocab_size=vocab_size, bos_token_id=eos_id, eos_token_id=eos_id, **SHAPE, **extra.get(family, {}), **more)

    return build


FAMILIES = ("qwen2", "llama", "mistral", "phi3", "qwen3")


def build(directory, family: str, train_steps: int = 0, seed: int = 0):
    from toy_decoder import build_decoder

    return build_decoder(directory, family, make_config=make_config(family), context=CONTEXT, seed=seed,
                         train_steps=train_steps, train_batch=8)
