"""attend() returns the log-sum-exp its merge needs, on every backend; merge() of disjoint key sets
equals attention over their union."""

from __future__ import annotations

import math

import pytest
import torch

from ropescale.attention import merge as merging
from ropescale.attention.merge import attend, merge

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def naive(query, key, value, scale, allowed):
    n_rep = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(n_rep, 1).double(), value.repeat_interleave(n_rep, 1).double()
    scores = ((query.double() @ key.transpose(2, 3)) * scale).masked_fill(~allowed, -math.inf)
    lse = scores.logsumexp(-1)
    return scores.softmax(-1).nan_to_num(0.0) @ value, lse


def inputs(b=2, h=4, h_kv=2, q=9, kv=13, d=16, seed=0, device="cpu"):
    torch.manual_seed(seed)
    return [torch.randn(b, n, s, d, device=device) for n, s in ((h, q), (h_kv, kv), (h_kv, kv))]


@pytest.mark.parametrize("backend", ["auto", "eager"])
@pytest.mark.parametrize("device", DEVICES)
def test_masked_attention_and_its_lse(backend, device):
    query, key, value = inputs(device=device)
    mask = torch.rand(2, 1, 9, 13, device=device) > 0.4
    mask[0, 0, 3] = False  # a row without keys: out 0, lse −inf
    out, lse = attend(query, key, value, 0.3, mask=mask, backend=backend)
    ref_out, ref_lse = naive(query, key, value, 0.3, mask)
    torch.testing.assert_close(out.double(), ref_out, rtol=0, atol=2e-6)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=0, atol=2e-6)
    assert lse.dtype == torch.float32 and torch.isneginf(lse[0, :, 3]).all() and (out[0, :, 3] == 0).all()


@pytest.mark.parametrize("backend", ["auto", "eager"])
@pytest.mark.parametrize("device", DEVICES)
def test_causal_and_broadcast_masks(backend, device):
    query, key, value = inputs(q=11, kv=11, device=device)
    causal = torch.ones(11, 11, dtype=torch.bool, device=device).tril()
    out, lse = attend(query, key, value, 0.25, causal=True, backend=backend)
    ref = naive(query, key, value, 0.25, causal)
    torch.testing.assert_close((out.double(), lse.double()), ref, rtol=0, atol=2e-6)
    keys = torch.rand(2, 1, 1, 11, device=device) > 0.5  # one row broadcast over all queries
    out, lse = attend(query, key, value, 0.25, mask=keys, backend=backend)
    torch.testing.assert_close((out.double(), lse.double()), naive(query, key, value, 0.25, keys), rtol=0, atol=2e-6)


def test_masked_calls_are_cut_into_row_blocks(monkeypatch):
    query, key, value = inputs(q=40, kv=30)
    mask = torch.rand(1, 1, 40, 30) > 0.3
    whole = attend(query, key, value, 0.3, mask=mask)
    monkeypatch.setattr(merging, "MASK_BUDGET", 7 * 30)  # blocks of 7 rows
    torch.testing.assert_close(attend(query, key, value, 0.3, mask=mask), whole, rtol=0, atol=1e-6)


def test_empty_inputs_give_empty_rows():
    query, key, value = inputs(q=3, kv=0)
    out, lse = attend(query, key, value, 0.3)
    assert out.shape == (2, 4, 3, 16) and (out == 0).all() and torch.isneginf(lse).all()
    out, lse = attend(*inputs(q=0, kv=5), 0.3)
    assert out.shape == (2, 4, 0, 16)


def test_validation():
    query, key, value = inputs()
    with pytest.raises(ValueError, match="causal attention needs as many queries as keys"):
        attend(query, key, value, 0.3, causal=True)
    with pytest.raises(ValueError, match="unknown attention backend 'x'"):
        attend(query, key, value, 0.3, backend="x")
    with pytest.raises(ValueError, match="not a multiple"):
        attend(torch.randn(1, 3, 2, 16), key, value, 0.3)


@pytest.mark.parametrize("device", DEVICES)
def test_merging_disjoint_key_sets_is_attention_over_their_union(device):
    query, key, value = inputs(q=10, kv=10, device=device)
    causal = torch.ones(10, 10, dtype=torch.bool, device=device).tril()
    odd = torch.zeros(10, 10, dtype=torch.bool, device=device)
    odd[:, 1::2] = True
    # three regions: odd keys, even keys before row 6, even keys from row 6 on (only rows 6..9)
    first = attend(query, key, value, 0.3, mask=causal & odd)
    early = attend(query, key, value, 0.3, mask=causal & ~odd & (torch.arange(10, device=device) < 6)[None])
    late = attend(query[:, :, 6:], key, value, 0.3, mask=(causal & ~odd & (torch.arange(10, device=device) >= 6))[6:])
    got = merge([(*first, 0), (*early, 0), (*late, 6)], 10)
    torch.testing.assert_close(got.double(), naive(query, key, value, 0.3, causal)[0], rtol=0, atol=2e-6)
    assert not torch.allclose(got, first[0].float(), atol=1e-3)  # each part alone is not the answer


@pytest.mark.parametrize("n", [8, 12, 21])
def test_blockwise_pairs_each_query_block_with_its_key_block(n):
    """Causal within blocks of 4 (the last one short), and query block i against a whole key block i
    under a shared mask, as the band and chunk calls use them."""
    query, key, value = inputs(q=n, kv=n + 4)
    block = torch.arange(n + 4) // 4
    own = (block[:n, None] == block[None, :]) & (torch.arange(n)[:, None] >= torch.arange(n + 4)[None, :])
    out = merging.blockwise(query, key[:, :, :n], value[:, :, :n], 4, 0.3, causal=True)
    torch.testing.assert_close(
        (out[0].double(), out[1].double()), naive(query, key, value, 0.3, own), rtol=0, atol=2e-6
    )
    upper = torch.ones(4, 4, dtype=torch.bool).triu(1)
    paired = (block[:n, None] == block[None, :]) & upper.repeat(-(-n // 4) + 1, -(-n // 4) + 1)[:n, : n + 4]
    out = merging.blockwise(query, key, value, 4, 0.3, mask=upper[None, None])
    ref = naive(query, key, value, 0.3, paired)
    torch.testing.assert_close((out[0].double(), out[1].double()), ref, rtol=0, atol=2e-6)
