"""STRING: the merged attention against the eager reference from the paper's shifted position
matrix (every path), and the installed method: cached decoding equals recomputation, padded batches
equal rows alone, frequencies from another method, validation."""

from __future__ import annotations

import math

import pytest
import torch

import ropescale
from ropescale.attention.rotate_on_read import AttentionRotary
from ropescale.attention.string import string_attention
from ropescale.methods import RotarySpec, get_method
from tests.attention.decoding import assert_padded_batch_equals_rows_alone, cached_vs_full, max_diff
from tests.attention.references import random_qkv, region_reference, string_regions
from tests.conftest import ORIGINAL_CONTEXT, tiny_model

TOL = 2e-6
SPEC = RotarySpec(16, 1e4, ORIGINAL_CONTEXT)


class Layer:
    """Just enough of an attention layer for the attention function: its rotary module."""

    def __init__(self, shift, local_window):
        # the kernel's positions; the reference's cos/sin factor is checked in test_reference_methods.py
        method = get_method("string", shift=shift, local_window=local_window, temperature="frequencies")
        rotary = AttentionRotary(method, SPEC, "string", "sdpa")
        rotary.shift, rotary.local_window = shift, local_window
        self._ropescale_rotary = rotary


def run(q, k, v, q_pos, mask, shift, local_window):
    out, _ = string_attention(Layer(shift, local_window), q, k, v, mask, scaling=0.25, position_ids=q_pos)
    return out.transpose(1, 2)


def reference(q, k, v, q_pos, k_pos, shift, local_window, key_mask=None):
    regions = string_regions(q_pos, k_pos, shift, local_window)
    return region_reference(q, k, v, q_pos, k_pos, regions, SPEC.base_inv_freq(), 0.25, key_mask)


@pytest.mark.parametrize("n", [9, 21, 22, 50, 63])
@pytest.mark.parametrize("q_len", [None, 1, 4])  # prefill, a decoding step, chunked prefill (masked path)
def test_matches_the_reference(n, q_len):
    q, k, v, q_pos, k_pos = random_qkv(n, q_len)
    expected = reference(q, k, v, q_pos, k_pos, 21, 3)
    torch.testing.assert_close(run(q, k, v, q_pos, None, 21, 3).double(), expected, rtol=0, atol=TOL)


def test_padding_matches_the_reference():
    q, k, v, _, _ = random_qkv(50)
    pad = torch.tensor([0, 7])
    k_pos = (torch.arange(50)[None] - pad[:, None]).clamp(min=0)
    key_mask = torch.arange(50)[None] >= pad[:, None]
    mask = torch.ones(50, 50, dtype=torch.bool).tril()[None, None] & key_mask[:, None, None]
    real = key_mask[:, None, :, None]
    expected = reference(q, k, v, k_pos, k_pos, 21, 3, key_mask)
    torch.testing.assert_close(run(q, k, v, k_pos, mask, 21, 3).double() * real, expected * real, rtol=0, atol=TOL)


def test_defaults_reach_and_validation():
    spec = RotarySpec(64, 1e5, 8192)
    method = get_method("string")
    assert method.resolved_params(spec) == {
        "factor": 1.0,
        "shift": 2703,  # HKUNLP/STRING README: int(0.33 * L), local window 128
        "local_window": 128,
        "frequencies": "default",
        "logn": False,
        "temperature": "string",
    }
    assert method.reach(spec) == 8192 + 2703 - 128
    assert get_method("string").resolved_local_window(RotarySpec(64, 1e4, 256)) == 4  # 128 >= S = 84: L/64
    assert method.compute(spec)[1] == 0.1 * math.log(2) + 1  # string_for_llama.py's attention_factor
    yarn = get_method("string", factor=4, frequencies="YaRN")
    inv_freq, factor = yarn.compute(spec)
    expected = get_method("yarn", factor=4).compute(spec)
    # string_for_qwen2.py: YaRN's frequencies, STRING's factor in place of YaRN's own
    assert torch.equal(inv_freq, expected[0]) and factor == 0.1 * math.log(2) + 1 and yarn.frequencies == "yarn"
    own = get_method("string", factor=4, frequencies="yarn", temperature="frequencies").compute(spec)
    assert own[1] == expected[1]
    with pytest.raises(ValueError, match="temperature must be one of string, frequencies, got 'yarn'"):
        get_method("string", temperature="yarn")
    with pytest.raises(ValueError, match="STRING with plain RoPE reaches 84 tokens"):
        ropescale.patch_config(tiny_model().config, "string", factor=2)  # L = 64: 64 + 21 - 1 = 84 < 128
    with pytest.raises(ValueError, match="local_window must be smaller than shift 21, got 21"):
        ropescale.patch_config(tiny_model().config, "string", local_window=21)
    with pytest.raises(ValueError, match="frequencies must be one of default, linear, ntk, yarn, got 'dca'"):
        get_method("string", frequencies="dca")


@pytest.mark.parametrize("frequencies", ["default", "yarn"])
def test_cached_decoding_equals_recomputation(frequencies):
    torch.manual_seed(5)
    ids = torch.randint(0, 128, (2, 120))
    factor = 1 if frequencies == "default" else 2
    model = ropescale.patch(tiny_model(num_hidden_layers=3), "string", factor=factor, frequencies=frequencies)
    rotary = model.model.rotary_emb
    assert model.config._attn_implementation == "ropescale_string" and (rotary.shift, rotary.local_window) == (21, 1)
    n = 80 if frequencies == "default" else 120  # plain RoPE: within its reach, 64 + 21 - 1
    cached, full = cached_vs_full(model, ids[:, :n], prompt=15)
    assert max_diff(cached, full) < TOL


def test_left_padded_batch_equals_rows_alone():
    torch.manual_seed(6)
    model = ropescale.patch(tiny_model(attn_implementation="sdpa"), "string", shift=16, local_window=4)
    assert_padded_batch_equals_rows_alone(model, short=20, long=50, new_tokens=10)


def test_within_the_shift_it_is_plain_attention(long_input):
    plain = tiny_model(attn_implementation="sdpa")
    model = ropescale.patch(
        tiny_model(state_dict=plain.state_dict()), "string", shift=30, local_window=4, temperature="frequencies"
    )
    with torch.no_grad():
        short, longer = long_input[:, :30], long_input[:, :60]
        torch.testing.assert_close(model(short).logits, plain(short).logits, rtol=0, atol=TOL)
        assert not torch.allclose(model(longer).logits, plain(longer).logits, atol=1e-3)
