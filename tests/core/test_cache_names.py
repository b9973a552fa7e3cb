"""The cache's argument name follows the installed transformers (``cache`` from 5.25, ``past_key_values``
before): the old name is deprecated in 5.25 and gone in 5.40, both inside ``transformers>=5.0,<6``."""

from types import SimpleNamespace

from xformopt.models.cache_names import cache_kwargs, output_cache


class _OldForward:
    def forward(self, input_ids=None, past_key_values=None, use_cache=None):
        return None


class _NewForward:
    def forward(self, input_ids=None, cache=None, use_cache=None):
        return None


def test_the_argument_is_named_as_the_forward_names_it():
    marker = object()
    assert cache_kwargs(_OldForward(), marker) == {"past_key_values": marker}
    assert cache_kwargs(_NewForward(), marker) == {"cache": marker}


def test_the_returned_cache_is_read_under_either_name():
    marker = object()
    assert output_cache(SimpleNamespace(past_key_values=marker)) is marker
    assert output_cache(SimpleNamespace(cache=marker, past_key_values=None)) is marker
    assert output_cache(SimpleNamespace(cache=None)) is None


def test_a_cached_forward_through_the_runner_passes_the_current_name(tmp_path):
    """TorchDecoder's cached steps on a tiny Llama hand the cache under the name the installed forward
    takes (seen by a forward pre-hook, before transformers' own renaming), and the second step reads the
    first step's cache."""
    import inspect

    import numpy as np
    import torch
    import transformers

    from xformopt.runtime.decoder import TorchDecoder

    config = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path)
    decoder = TorchDecoder(tmp_path)
    accepted = set(inspect.signature(type(decoder.model).forward).parameters)
    seen = []
    decoder.model.register_forward_pre_hook(lambda module, args, kwargs: seen.append(set(kwargs)), with_kwargs=True)
    _, state = decoder.forward(np.array([[1, 2, 3]], dtype=np.int64))
    step, _ = decoder.forward(np.array([[4]], dtype=np.int64), state)
    full, _ = decoder.forward(np.array([[1, 2, 3, 4]], dtype=np.int64))
    assert seen and all(names <= accepted for names in seen)
    np.testing.assert_allclose(step[0, -1], full[0, -1], atol=1e-5)
