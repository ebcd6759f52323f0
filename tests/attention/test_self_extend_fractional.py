"""Self-Extend with fractional grouping (``fractional=true``): far pairs at p / G, no floor.

Checked against the eager region reference (``tests/attention/references.py``: float64 scores from
the independent ``ropescale.rotary_reference``, one softmax) with the positions written out here, on every
kernel path; then on tiny models: cached decoding equals recomputation, padded rows equal rows
alone, the parameter survives a save, and it changes what the floor would compute.
"""

from __future__ import annotations

import pytest
import torch

import ropescale
from ropescale.attention import merge as merging
from ropescale.attention.rotate_on_read import AttentionRotary
from ropescale.attention.self_extend import _self_extend
from ropescale.methods import RotarySpec, get_method
from ropescale.methods.self_extend import fractional_positions, grouped_positions
from tests.attention.decoding import assert_padded_batch_equals_rows_alone, cached_vs_full, max_diff
from tests.attention.references import random_qkv, region_reference, self_extend_regions
from tests.conftest import ORIGINAL_CONTEXT, tiny_model

TOL = 2e-6
SPEC = RotarySpec(16, 1e4, 64)


def run(q, k, v, q_pos, mask, G, W):
    rotary = AttentionRotary(get_method("self_extend", group_size=G, window=W), SPEC, "self_extend", "sdpa")
    rotary.group_size, rotary.window, rotary.fractional = G, W, True
    return _self_extend(q, k, v, mask, q_pos, rotary, 0.25).transpose(1, 2)  # [b, h, q, d]


def reference(q, k, v, q_pos, k_pos, G, W, key_mask=None):
    regions = self_extend_regions(q_pos, k_pos, G, W, fractional=True)
    return region_reference(q, k, v, q_pos, k_pos, regions, SPEC.base_inv_freq(), 0.25, key_mask)


def test_positions():
    p = torch.tensor([0, 5, 16, 17, 100])
    q, k = fractional_positions(p, p, group_size=4, window=16)
    assert q.tolist() == [12.0, 13.25, 16.0, 16.25, 37.0] and k.tolist() == [0.0, 1.25, 4.0, 4.25, 25.0]
    i, j = torch.arange(16, 200), torch.tensor([0])
    rel = fractional_positions(i, i, 4, 16)[0] - fractional_positions(j, j, 4, 16)[1]
    assert rel[0] == 16  # continuous with the neighbours at i − j = W
    assert bool((rel.diff() == 0.25).all())  # every step of i moves the pair by 1 / G: order kept
    floor = grouped_positions(i, i, 4, 16)[0] - grouped_positions(j, j, 4, 16)[1]
    assert bool((floor.diff() == 0).any())  # ...where the floor puts G keys at one position


def test_reach():
    spec = RotarySpec(16, 1e4, ORIGINAL_CONTEXT)
    method = get_method("self_extend", group_size=4, window=16, fractional=True)
    n = method.reach(spec)
    q, k = fractional_positions(torch.arange(n + 1), torch.tensor([0]), 4, 16)
    assert float(q[n - 1] - k[0]) <= ORIGINAL_CONTEXT - 1 < float(q[n] - k[0])  # last in range, first beyond
    with pytest.raises(ValueError, match="use group_size >= "):
        ropescale.patch_config(tiny_model().config, "self_extend", factor=4, group_size=2, window=16, fractional=True)


@pytest.mark.parametrize("n", [5, 16, 17, 40, 97])
@pytest.mark.parametrize("group_size,window", [(4, 16), (3, 10)])
def test_prefill_matches_the_reference(n, group_size, window):
    q, k, v, q_pos, k_pos = random_qkv(n)
    got = run(q, k, v, q_pos, None, group_size, window)
    torch.testing.assert_close(got.double(), reference(q, k, v, q_pos, k_pos, group_size, window), rtol=0, atol=TOL)


@pytest.mark.parametrize("n", [1, 16, 17, 97])
def test_decoding_step_matches_the_reference(n):
    q, k, v, q_pos, k_pos = random_qkv(n, q_len=1)
    torch.testing.assert_close(
        run(q, k, v, q_pos, None, 3, 10).double(), reference(q, k, v, q_pos, k_pos, 3, 10), rtol=0, atol=TOL
    )


def test_masked_paths_match_the_reference(monkeypatch):
    q, k, v, q_pos, k_pos = random_qkv(70, q_len=30)  # chunked prefill over a cache
    torch.testing.assert_close(
        run(q, k, v, q_pos, None, 4, 16).double(), reference(q, k, v, q_pos, k_pos, 4, 16), rtol=0, atol=TOL
    )
    q, k, v, _, _ = random_qkv(50)  # left padding, in row blocks
    monkeypatch.setattr(merging, "MASK_BUDGET", 4 * 50)
    pad = torch.tensor([0, 7])
    pos = (torch.arange(50)[None] - pad[:, None]).clamp(min=0)
    key_mask = torch.arange(50)[None] >= pad[:, None]
    mask = torch.ones(50, 50, dtype=torch.bool).tril()[None, None] & key_mask[:, None, None]
    expected = reference(q, k, v, pos, pos, 4, 16, key_mask)
    real = key_mask[:, None, :, None]  # padded query rows are nobody's business
    torch.testing.assert_close(run(q, k, v, pos, mask, 4, 16).double() * real, expected * real, rtol=0, atol=TOL)


def _logits(model, ids):
    with torch.no_grad():
        return model(ids, use_cache=False).logits


def test_model_cache_padding_save_and_difference(tmp_path):
    torch.manual_seed(5)
    ids = torch.randint(0, 128, (2, 150))
    model = ropescale.patch(tiny_model(num_hidden_layers=3), "self_extend", factor=4, window=16, fractional=True)
    cached, full = cached_vs_full(model, ids, prompt=40)  # across the window and L, rotated keys kept
    assert max_diff(cached, full) < TOL
    assert_padded_batch_equals_rows_alone(model, short=50, long=90, new_tokens=10)
    floor = ropescale.patch(
        tiny_model(num_hidden_layers=3, state_dict=model.state_dict()), "self_extend", factor=4, window=16
    )
    within = ids[:, :16]  # no far pair yet: the same model
    torch.testing.assert_close(_logits(model, within), _logits(floor, within), rtol=0, atol=0)
    assert not torch.allclose(_logits(model, ids), _logits(floor, ids), atol=1e-3)
    ropescale.save_pretrained(model, tmp_path / "ckpt")
    again = ropescale.from_pretrained(tmp_path / "ckpt")
    assert again.model.rotary_emb.fractional is True
    torch.testing.assert_close(_logits(again, ids), _logits(model, ids), rtol=0, atol=0)
