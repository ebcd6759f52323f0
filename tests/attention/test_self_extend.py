"""Self-Extend: the positions formula, G = 1 equals plain attention, a naive reference, and the KV cache.

The reference below follows the paper (arXiv 2401.01325, docs/methods.md) and LongLM's eager code literally: it builds
both score matrices with ``ropescale.rotary_reference`` (an independent rotation), merges them where
i − j < W, and softmaxes; the log-sum-exp-merged path must match it (tensor-level checks of every
path: test_self_extend_kernel.py).
"""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AttentionInterface

import ropescale
from ropescale.attention.rotate_on_read import AttentionRotary, rotary_of
from ropescale.methods import RotarySpec, get_method
from ropescale.methods.self_extend import grouped_positions
from ropescale.rotary_reference import apply_rotary, cos_sin
from tests.attention.decoding import assert_padded_batch_equals_rows_alone, cached_vs_full, max_diff
from tests.conftest import ORIGINAL_CONTEXT, tiny_model

L = ORIGINAL_CONTEXT
TOL = 2e-6


def reference_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """Self-Extend spelled out for one unpadded sequence without cache (q = kv)."""
    rotary = rotary_of(module)
    G, W = rotary.group_size, rotary.window
    pos = kwargs["position_ids"][0]  # [s]

    def rope(x, positions):
        cos, sin = cos_sin(rotary.inv_freq, positions)
        return apply_rotary(x, x, cos, sin)[0]

    n_rep = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(n_rep, 1), value.repeat_interleave(n_rep, 1)
    near = rope(query, pos) @ rope(key, pos).transpose(2, 3)  # [b, h, s, s]
    far = rope(query, pos // G + W - W // G) @ rope(key, pos // G).transpose(2, 3)
    i, j = pos[:, None], pos[None, :]
    scores = torch.where(i - j < W, near, far).masked_fill(j > i, float("-inf")) * scaling
    return (scores.softmax(-1) @ value).transpose(1, 2), None


REFERENCE = "ropescale_test_self_extend_reference"
AttentionInterface.register(REFERENCE, reference_attention)


def logits(model, ids):
    with torch.no_grad():
        return model(ids, use_cache=False).logits


def test_positions_follow_the_formula():
    positions = torch.tensor([0, 5, 15, 16, 17, 100, 207])
    q, k = grouped_positions(positions, positions, group_size=4, window=16)
    assert q.tolist() == [12, 13, 15, 16, 16, 37, 63]  # i // 4 + 16 − 4
    assert k.tolist() == [0, 1, 3, 4, 4, 25, 51]  # j // 4


def test_reach_is_where_grouped_distances_leave_the_trained_range():
    spec = RotarySpec(16, 1e4, L)
    method = get_method("self_extend", group_size=4, window=16)
    n = method.reach(spec)
    assert n == 4 * (L - 16 + 4) == 208 == method.extended_context(spec)  # factor 1: the reach
    q, k = grouped_positions(torch.arange(n + 1), torch.tensor([0]), 4, 16)
    assert int(q[n - 1] - k[0]) == L - 1 and int(q[n] - k[0]) == L  # last in range, first beyond


def test_defaults_and_validation():
    spec = RotarySpec(64, 1e5, 8192)  # SmolLM2-135M
    method = get_method("self_extend", factor=4)
    assert (method.resolved_window(spec), method.resolved_group_size(spec)) == (1024, 5)
    assert method.reach(spec) >= 4 * 8192 > get_method("self_extend", factor=4, group_size=4).reach(spec)
    assert get_method("self_extend", group_size="8", window="1024").params() == {
        "factor": 1.0,
        "group_size": 8,
        "window": 1024,
        "logn": False,
        "fractional": False,
        "shift": "floor",
    }  # CLI strings
    with pytest.raises(ValueError, match="shift must be one of floor, float, got 'round'"):
        get_method("self_extend", shift="round")
    with pytest.raises(ValueError, match="shift=float applies to integer grouping"):
        get_method("self_extend", shift="float", fractional=True)
    with pytest.raises(ValueError, match="use group_size >= 6"):
        ropescale.patch_config(tiny_model().config, "self_extend", factor=4, group_size=2, window=16)
    with pytest.raises(ValueError, match="window must be smaller than the original context 64"):
        ropescale.patch_config(tiny_model().config, "self_extend", window=64, group_size=2)
    for bad in (0, -1, 2.5, "x", True):
        with pytest.raises(ValueError, match="group_size must be a positive integer"):
            get_method("self_extend", group_size=bad)


@pytest.mark.parametrize("arch", ["llama", "mistral"])
def test_group_size_1_is_plain_attention(arch, long_input):
    plain = tiny_model(arch, attn_implementation="sdpa")
    patched = ropescale.patch(tiny_model(arch, state_dict=plain.state_dict()), "self_extend", group_size=1, window=16)
    assert patched.config._attn_implementation == "ropescale_self_extend"
    torch.testing.assert_close(logits(patched, long_input), logits(plain, long_input), rtol=0, atol=TOL)


@pytest.mark.parametrize("group_size,window", [(4, 16), (3, 10), (8, 32)])
def test_matches_the_reference(group_size, window, long_input):
    model = ropescale.patch(tiny_model(), "self_extend", group_size=group_size, window=window)
    ids = long_input[:, : model.config.max_position_embeddings]
    got = logits(model, ids)
    model.set_attn_implementation(REFERENCE)
    model.model.rotary_emb.attention_name = REFERENCE  # it too takes unrotated q/k from the layers
    expected = logits(model, ids)
    torch.testing.assert_close(got, expected, rtol=0, atol=TOL)
    plain = tiny_model(state_dict=model.state_dict())
    assert not torch.allclose(got, logits(plain, ids), atol=1e-3)  # grouping did change something


@pytest.mark.parametrize("arch", ["llama", "mistral"])
def test_cached_decoding_equals_recomputation(arch):
    """Positions depend on (i, j) only, so every layer's cache stays valid: cached decoding equals a
    full pass, across the window and L."""
    torch.manual_seed(5)
    ids = torch.randint(0, 128, (2, 150))
    model = ropescale.patch(tiny_model(arch, num_hidden_layers=3), "self_extend", factor=4, window=16)
    assert model.model.rotary_emb.group_size == 6  # the smallest G reaching 4 x 64: 6 * (64 - 16 + 2)
    cached, full = cached_vs_full(model, ids, prompt=40)
    assert max_diff(cached, full) < TOL


def test_left_padded_batch_equals_rows_alone():
    torch.manual_seed(6)
    model = ropescale.patch(tiny_model(attn_implementation="sdpa"), "self_extend", group_size=4, window=16)
    assert_padded_batch_equals_rows_alone(model, short=50, long=90, new_tokens=20)


def test_save_reload_and_replace(tmp_path, long_input):
    model = ropescale.patch(tiny_model(), "self_extend", factor=2, window=16)
    ropescale.save_pretrained(model, tmp_path / "ckpt")
    saved = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert saved["model_type"] == "ropescale_llama" and saved["ropescale"]["method"] == "self_extend"
    again = ropescale.from_pretrained(tmp_path / "ckpt")
    rotary = again.model.rotary_emb
    assert isinstance(rotary, AttentionRotary) and (rotary.group_size, rotary.window) == (3, 16)
    torch.testing.assert_close(logits(again, long_input), logits(model, long_input), rtol=0, atol=0)
    ropescale.patch(again, "yarn", factor=4, replace=True)
    assert again.config._attn_implementation == "sdpa"  # the loaded model's own attention is back
    fresh = ropescale.patch(tiny_model(state_dict=model.state_dict(), attn_implementation="sdpa"), "yarn", factor=4)
    torch.testing.assert_close(logits(again, long_input), logits(fresh, long_input), rtol=0, atol=0)


def test_cli_selects_it(tmp_path):
    from ropescale.cli.main import main

    tiny_model().save_pretrained(tmp_path / "tiny")
    code = main(
        [
            "patch",
            "--model",
            str(tmp_path / "tiny"),
            "--method",
            "self_extend",
            "--factor",
            "4",
            "--param",
            "group_size=8",
            "--param",
            "window=16",
            "--output",
            str(tmp_path / "out"),
        ]
    )
    assert code == 0
    block = json.loads((tmp_path / "out" / "config.json").read_text())["ropescale"]
    assert block["params"] == {
        "factor": 4.0,
        "group_size": 8,
        "window": 16,
        "logn": False,
        "fractional": False,
        "shift": "floor",
    }
    assert ropescale.from_pretrained(tmp_path / "out").config._attn_implementation == "ropescale_self_extend"


def test_switching_the_attention_away_gives_plain_rope(long_input):
    model = ropescale.patch(tiny_model(), "self_extend", group_size=4, window=16)
    model.set_attn_implementation("eager")
    plain = tiny_model(state_dict=model.state_dict())
    torch.testing.assert_close(logits(model, long_input), logits(plain, long_input), rtol=0, atol=0)
