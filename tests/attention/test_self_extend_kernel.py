"""Self-Extend's merged attention against the eager two-matrix reference, tensor by tensor (fp32):
every path (mask-free prefill, decoding, the masked fallback) and lengths around the window."""

from __future__ import annotations

import pytest
import torch

from ropescale.attention import merge as merging
from ropescale.attention.rotate_on_read import AttentionRotary
from ropescale.attention.self_extend import banded_attention
from ropescale.methods import RotarySpec, get_method
from ropescale.methods.self_extend import grouped_positions
from tests.attention.references import random_qkv, region_reference, self_extend_regions

TOL = 2e-6
SPEC = RotarySpec(16, 1e4, 64)


def run(q, k, v, q_pos, mask, G, W):
    rotary = AttentionRotary(get_method("self_extend", group_size=G, window=W), SPEC, "self_extend", "sdpa")
    return banded_attention(
        q,
        k,
        v,
        mask,
        q_pos,
        rotary,
        width=W,
        far_query=lambda p: grouped_positions(p, p, G, W)[0],
        far_key=lambda p: p // G,
        scale=0.25,
    ).transpose(1, 2)  # [b, h, q, d]


def reference(q, k, v, q_pos, k_pos, G, W, key_mask=None):
    regions = self_extend_regions(q_pos, k_pos, G, W)
    return region_reference(q, k, v, q_pos, k_pos, regions, SPEC.base_inv_freq(), 0.25, key_mask)


@pytest.mark.parametrize("n", [5, 16, 17, 40, 48, 97])
@pytest.mark.parametrize("group_size,window", [(4, 16), (3, 10)])
def test_prefill_matches_the_reference(n, group_size, window):
    q, k, v, q_pos, k_pos = random_qkv(n)
    got = run(q, k, v, q_pos, None, group_size, window)
    torch.testing.assert_close(got.double(), reference(q, k, v, q_pos, k_pos, group_size, window), rtol=0, atol=TOL)


@pytest.mark.parametrize("n", [1, 9, 16, 17, 60, 97])
@pytest.mark.parametrize("group_size,window", [(4, 16), (3, 10)])  # 3 ∤ 10: the window edge matters
def test_decoding_step_matches_the_reference(n, group_size, window):
    q, k, v, q_pos, k_pos = random_qkv(n, q_len=1)
    expected = reference(q, k, v, q_pos, k_pos, group_size, window)
    torch.testing.assert_close(run(q, k, v, q_pos, None, group_size, window).double(), expected, rtol=0, atol=TOL)


@pytest.mark.parametrize("q_len", [3, 30])
def test_chunked_prefill_over_a_cache_takes_the_masked_path(q_len, monkeypatch):
    q, k, v, q_pos, k_pos = random_qkv(70, q_len=q_len)
    expected = reference(q, k, v, q_pos, k_pos, 4, 16)
    torch.testing.assert_close(run(q, k, v, q_pos, None, 4, 16).double(), expected, rtol=0, atol=TOL)
    monkeypatch.setattr(merging, "MASK_BUDGET", 4 * 70)  # and in row blocks
    torch.testing.assert_close(run(q, k, v, q_pos, None, 4, 16).double(), expected, rtol=0, atol=TOL)


def test_padding_mask_matches_the_reference():
    q, k, v, _, _ = random_qkv(50)
    pad = torch.tensor([0, 7])
    k_pos = (torch.arange(50)[None] - pad[:, None]).clamp(min=0)
    key_mask = torch.arange(50)[None] >= pad[:, None]  # [b, kv]
    mask = torch.ones(50, 50, dtype=torch.bool).tril()[None, None] & key_mask[:, None, None]
    got = run(q, k, v, k_pos, mask, 4, 16)
    expected = reference(q, k, v, k_pos, k_pos, 4, 16, key_mask)
    real = key_mask[:, None, :, None]  # padded query rows are nobody's business
    torch.testing.assert_close((got.double() * real), expected * real, rtol=0, atol=TOL)


def test_the_mask_free_and_masked_paths_agree():
    q, k, v, q_pos, _ = random_qkv(97)
    causal = torch.ones(97, 97, dtype=torch.bool).tril()[None, None]
    torch.testing.assert_close(run(q, k, v, q_pos, causal, 4, 16), run(q, k, v, q_pos, None, 4, 16), rtol=0, atol=TOL)
