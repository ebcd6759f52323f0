"""A static KV cache with an attention-level mode is refused in one line, not run wrong.

Self-Extend and the KV-consistent mode give cached key j the position it had when it arrived, which
holds for the default dynamic cache only: with ``cache_implementation="static"`` generation ran and
its logits differed from the dynamic cache's (by 1.6e-2 with Self-Extend, 1.7e-3 with dynamic NTK
on this tiny model).
"""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, StaticCache

import ropescale
from ropescale.attention.cache_guard import UnsupportedCacheError
from tests.conftest import tiny_model

GENERATE = dict(max_new_tokens=8, do_sample=False, pad_token_id=0)
METHODS = [("self_extend", {}), ("dynamic_ntk", {}), ("dynamic_yarn", {})]


@pytest.fixture
def ids():
    torch.manual_seed(0)
    return torch.randint(1, 128, (1, 100))  # [b, s]: beyond L = 64, where the modes differ from plain RoPE


@pytest.mark.parametrize("method, params", METHODS)
def test_generate_with_a_static_cache_is_refused(method, params, ids):
    model = ropescale.patch(tiny_model(num_hidden_layers=1), method, factor=4, **params)
    with pytest.raises(UnsupportedCacheError, match=r"StaticCache \(StaticLayer\) does not") as info:
        model.generate(ids, cache_implementation="static", **GENERATE)
    assert "\n" not in str(info.value)
    model.generate(ids, **GENERATE)  # the default dynamic cache still works


@pytest.mark.parametrize("method, params", METHODS)
def test_a_static_cache_passed_in_is_refused(method, params, ids):
    model = ropescale.patch(tiny_model(num_hidden_layers=1), method, factor=4, **params)
    cache = StaticCache(config=model.config, max_cache_len=128)
    with pytest.raises(UnsupportedCacheError, match="use the default dynamic cache"):
        model(ids, past_key_values=cache, use_cache=True)
    with pytest.raises(UnsupportedCacheError):
        model.generate(ids, past_key_values=StaticCache(config=model.config, max_cache_len=128), **GENERATE)
    model(ids, past_key_values=DynamicCache(config=model.config), use_cache=True)


@pytest.mark.parametrize("name", ["cache", "past_key_values"])  # transformers 5.24 renamed the argument
def test_the_decoder_is_checked_under_either_name_of_its_cache(name, ids):
    model = ropescale.patch(tiny_model(num_hidden_layers=1), "self_extend", factor=4)
    with pytest.raises(UnsupportedCacheError):
        model.model(ids, use_cache=True, **{name: StaticCache(config=model.config, max_cache_len=128)})


def test_without_the_mode_a_static_cache_is_fine_again(ids):
    """Re-patching with a static method removes the check with the mode; so does kv_consistent=false."""
    model = ropescale.patch(tiny_model(num_hidden_layers=1), "self_extend", factor=4)
    ropescale.patch(model, "yarn", factor=4, replace=True)
    static = model.generate(ids, cache_implementation="static", **GENERATE)
    assert torch.equal(static, model.generate(ids, **GENERATE))
    plain = ropescale.patch(tiny_model(num_hidden_layers=1), "dynamic_ntk", factor=4, kv_consistent=False)
    plain.generate(ids, cache_implementation="static", **GENERATE)
