"""Rotated keys kept beside the KV cache (ropescale.attention.rotated_cache): used, exact, never stale.

Every test decodes with the cache and compares with a full forward pass over the same tokens (no
cache: nothing kept), after the ways a cache can change other than by appending: a crop, a
reorder or selection of batch rows, a reset, a new cache. Without the staleness check (the
decoder's pre-hook vouching for the buffers) the crop, reorder and reset tests fail.
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from transformers import DynamicCache

import ropescale
import ropescale.attention.self_extend as self_extend_module
from ropescale.attention.rotated_cache import ATTR, RotatedKeys
from tests.conftest import tiny_model

TOL = 1e-5
#: small windows, chunks and shifts, so that 40–70 tokens cross them: every region is read
METHODS = {
    "self_extend": dict(group_size=4, window=16),
    "dca": dict(chunk_size=32, local_window=8),
    "string": dict(shift=16, local_window=4),
}


def model_for(method: str, layers: int = 2):
    return ropescale.patch(tiny_model(num_hidden_layers=layers), method, **METHODS[method])


def full_logits(model, ids: torch.Tensor) -> torch.Tensor:
    """Next-token logits after every prefix of ``ids``, from one forward pass without a cache. # [b, n, vocab]"""
    with torch.no_grad():
        return model(ids, use_cache=False).logits


def step(model, cache, ids: torch.Tensor) -> list[torch.Tensor]:
    """Feed ``ids`` one token at a time on ``cache``; the logits after each. # list of [b, vocab]"""
    out = []
    with torch.no_grad():
        for t in range(ids.shape[1]):
            out.append(model(ids[:, t : t + 1], past_key_values=cache, use_cache=True).logits[:, -1])
    return out


def prefill(model, ids: torch.Tensor) -> DynamicCache:
    cache = DynamicCache()
    with torch.no_grad():
        model(ids, past_key_values=cache, use_cache=True)
    return cache


def assert_matches(cached: list[torch.Tensor], full: torch.Tensor) -> None:
    """Cached step logits equal the full pass's at the same positions (the last len(cached))."""
    expected = full[:, -len(cached) :]
    got = torch.stack(cached, 1)
    torch.testing.assert_close(got, expected, rtol=0, atol=TOL)
    assert torch.equal(got.argmax(-1), expected.argmax(-1))


def states(cache) -> list:
    return [layer.__dict__.get(ATTR) for layer in cache.layers]


@pytest.mark.parametrize("method", sorted(METHODS))
def test_greedy_generation_equals_the_full_pass_and_rotating_every_step(method):
    torch.manual_seed(3)
    model = model_for(method)
    prompt = torch.randint(1, 128, (2, 40))
    kwargs = dict(max_new_tokens=24, do_sample=False, output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    with torch.no_grad():
        out = model.generate(prompt, **kwargs)
    assert all(state is not None and state.regions for state in states(out.past_key_values))  # they were kept
    logits = torch.stack(out.logits, 1)  # [b, 24, vocab]
    full = full_logits(model, out.sequences[:, :-1])[:, 39:]
    torch.testing.assert_close(logits, full, rtol=0, atol=TOL)
    assert torch.equal(out.sequences[:, 40:], full.argmax(-1))  # greedy == the full pass's argmax, every step
    model.model.rotary_emb.rotated_keys = False
    with torch.no_grad():
        rotating = model.generate(prompt, **kwargs)
    assert all(state is None for state in states(rotating.past_key_values))
    assert torch.equal(torch.stack(rotating.logits, 1), logits)  # the very same values, bit for bit


@pytest.mark.parametrize("method", sorted(METHODS))
def test_decoding_steps_in_a_row_rotate_only_their_own_keys(method, monkeypatch):
    torch.manual_seed(4)
    model = model_for(method)
    ids = torch.randint(1, 128, (1, 52))
    heads = model.config.num_key_value_heads
    rotated_rows = []
    rotate = self_extend_module.rotate  # the rotation every kernel's `rot` calls

    def counting(x, cos, sin):
        if x.shape[1] == heads:  # keys (queries have more heads)
            rotated_rows.append(x.shape[2])
        return rotate(x, cos, sin)

    monkeypatch.setattr(self_extend_module, "rotate", counting)
    for keep, most in ((True, 2), (False, None)):
        model.model.rotary_emb.rotated_keys = keep
        cache = prefill(model, ids[:, :40])
        per_step = []
        for t in range(40, 52):
            rotated_rows.clear()
            cached = step(model, cache, ids[:, t : t + 1])
            per_step.append(sum(rotated_rows))
            assert_matches(cached, full_logits(model, ids[:, : t + 1]))
        layers = model.config.num_hidden_layers
        if keep:  # Self-Extend: the new key (neighbours) and the one leaving the window (far); else one
            assert max(per_step) <= most * layers, per_step
        else:  # without them every step rotates the whole cache (at least once per layer)
            assert min(per_step) >= 40 * layers, per_step


@pytest.mark.parametrize("method", sorted(METHODS))
def test_a_cropped_cache_then_extended_equals_the_full_pass(method):
    torch.manual_seed(5)
    model = model_for(method)
    prompt, first, then = torch.randint(1, 128, (2, 40)), torch.randint(1, 128, (2, 10)), torch.randint(1, 128, (2, 12))
    cache = prefill(model, prompt)
    step(model, cache, first)
    kept = states(cache)
    cache.crop(-6)  # keep prompt + first[:4]; the buffers must not keep the 6 removed keys
    assert cache.get_seq_length() == 44
    cached = step(model, cache, then)
    assert_matches(cached, full_logits(model, torch.cat((prompt, first[:, :4], then), 1)))
    assert all(a is b for a, b in zip(states(cache), kept, strict=True))  # truncated, not rebuilt


@pytest.mark.parametrize("how", ["reorder_cache", "batch_select_indices"])
@pytest.mark.parametrize("method", sorted(METHODS))
def test_reordered_or_selected_batch_rows_equal_the_full_pass(method, how):
    torch.manual_seed(6)
    model = model_for(method)
    ids = torch.randint(1, 128, (2, 56))
    cache = prefill(model, ids[:, :40])
    step(model, cache, ids[:, 40:48])
    order = torch.tensor([1, 0]) if how == "reorder_cache" else torch.tensor([1])
    getattr(cache, how)(order)  # beam search reorders like this between steps
    rows = ids[order]
    cached = step(model, cache, rows[:, 48:])
    assert_matches(cached, full_logits(model, rows))


@pytest.mark.parametrize("method", sorted(METHODS))
def test_a_second_generate_with_the_same_model_on_a_new_or_reset_cache(method):
    torch.manual_seed(7)
    model = model_for(method)
    kwargs = dict(max_new_tokens=12, do_sample=False, output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    first, second = torch.randint(1, 128, (1, 44)), torch.randint(1, 128, (1, 44))
    with torch.no_grad():
        out = model.generate(first, **kwargs)
        again = model.generate(second, **kwargs)  # a new cache
        reused = out.past_key_values
        reused.reset()  # the same layer objects, emptied
        third = model.generate(second, past_key_values=reused, **kwargs)
    for result in (again, third):
        full = full_logits(model, result.sequences[:, :-1])[:, 43:]
        torch.testing.assert_close(torch.stack(result.logits, 1), full, rtol=0, atol=TOL)
        assert torch.equal(result.sequences[:, 44:], full.argmax(-1))


def test_kept_only_without_gradients_and_in_a_known_cache():
    torch.manual_seed(8)
    model = model_for("dca")
    ids = torch.randint(1, 128, (1, 40))
    cache = DynamicCache()
    model(ids, past_key_values=cache, use_cache=True)  # gradients on: keys that require grad are not kept
    assert states(cache) == [None, None]
    with torch.inference_mode():  # inference tensors (no version counter), then decoding outside the mode
        cache = prefill(model, ids[:, :30])
    cached = step(model, cache, ids[:, 30:])
    assert_matches(cached, full_logits(model, ids))
    with torch.no_grad():  # a cache the decoder creates itself is unknown to the pre-hook until passed back
        cache = model(ids[:, :30], use_cache=True).past_key_values
    assert states(cache) == [None, None]
    assert_matches(step(model, cache, ids[:, 30:]), full_logits(model, ids))
    assert all(state is not None for state in states(cache))


def test_a_copied_cache_starts_without_buffers_and_decodes_the_same():
    torch.manual_seed(9)
    model = model_for("self_extend")
    ids = torch.randint(1, 128, (1, 50))
    cache = prefill(model, ids[:, :40])
    copied = copy.deepcopy(cache)  # reusing a prompt's cache, as transformers' docs suggest
    assert all(not state.regions for state in states(copied))
    assert_matches(step(model, copied, ids[:, 40:]), full_logits(model, ids))
    assert all(state.regions for state in states(copied))
    pickle.loads(pickle.dumps(cache))  # weak references are not pickled


def test_the_cache_is_known_only_during_the_decoders_forward_and_the_hooks_go_with_the_mode():
    model = model_for("string")
    cache = prefill(model, torch.randint(1, 128, (1, 30)))
    assert model.model.rotary_emb._rotated_cache is None  # attention called outside a forward reads no buffers
    assert all(state is not None for state in states(cache))
    with pytest.raises(RuntimeError):
        with torch.no_grad():
            model(torch.randint(1, 128, (1, 2, 3)), past_key_values=cache)  # a failing call forgets it too
    assert model.model.rotary_emb._rotated_cache is None
    ropescale.patch(model, "yarn", factor=2, replace=True)
    assert not model.model._forward_hooks and not model.model._forward_pre_hooks


def test_a_windowed_buffer_keeps_only_the_rows_still_read():
    key = torch.randn(1, 2, 3000, 4)
    calls = []

    def rows(a, b):
        calls.append((a, b))
        return key[:, :, a:b] * 2

    buffer = RotatedKeys(window=16)
    for n in range(20, 3000):
        got = buffer.get(key, n - 16, n, rows)
        assert torch.equal(got, key[:, :, n - 16 : n] * 2)
    assert calls[0] == (4, 20) and all(b - a == 1 for a, b in calls[1:])  # one new row per step
    assert buffer.buffer.shape[2] <= 16 + 256 + 16
