"""LongRoPE's switch at L, made consistent with the KV cache.

transformers' LongRoPE uses the short factors while the sequence is within L and the long ones
beyond, each time for all positions: a generation that starts below L and crosses it keeps keys
rotated with the short factors in its cache while the new query uses the long ones. Patching
installs the KV-consistent mode for LongRoPE by default, which rotates every cached key with the
current factors: cached generation equals recomputation.
"""

from __future__ import annotations

import pytest
import torch

import ropescale
from ropescale.attention.rotate_on_read import AttentionRotary
from tests.attention.decoding import cached_vs_full, max_diff
from tests.conftest import ORIGINAL_CONTEXT, tiny_model

L = ORIGINAL_CONTEXT
TOL = 2e-6
LONG = [1.0, 1.2, 1.6, 2.2, 3.0, 3.6, 4.0, 4.4]  # 8 pairs (rotary dim 16), a made-up searched schedule
SHORT = [1.0, 1.0, 1.05, 1.1, 1.2, 1.3, 1.4, 1.5]


@pytest.fixture
def ids():
    torch.manual_seed(7)
    return torch.randint(0, 128, (2, L + 36))  # prompt of 48 < L, decoding to 100 > L


def _longrope(impl: str = "eager", **params):
    model = tiny_model(num_hidden_layers=1, attn_implementation=impl)
    return ropescale.patch(model, "longrope", factor=4, long_factor=LONG, **params)


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("short", [None, SHORT])
def test_cached_generation_across_L_equals_recomputation(impl, short, ids):
    params = {} if short is None else {"short_factor": short}
    model = _longrope(impl, **params)
    assert isinstance(model.model.rotary_emb, AttentionRotary) and model.config.ropescale["kv_consistent"]
    cached, full = cached_vs_full(model, ids, prompt=48)
    assert max_diff(cached, full) < TOL
    # transformers' own behaviour (kv_consistent=False): stale short-factor keys once past L
    plain = _longrope(impl, kv_consistent=False, **params)
    cached_old, full_old = cached_vs_full(plain, ids, prompt=48)
    below = L - 48 + 1
    assert max_diff(cached_old[:below], full_old[:below]) < TOL
    assert max_diff(cached_old, full_old) > 100 * TOL
    torch.testing.assert_close(torch.stack(full), torch.stack(full_old), rtol=0, atol=TOL)  # same model


def test_full_forwards_equal_transformers_own_longrope(ids):
    """Without a cache the mode changes nothing: below L the short factors, beyond the long ones."""
    model, plain = _longrope(short_factor=SHORT), _longrope(short_factor=SHORT, kv_consistent=False)
    with torch.no_grad():
        for n in (40, L, L + 1, 100):
            torch.testing.assert_close(model(ids[:, :n]).logits, plain(ids[:, :n]).logits, rtol=0, atol=TOL)


def test_no_switch_no_mode(ids):
    """short_factor = long_factor: the frequencies never change, so nothing needs the mode."""
    model = _longrope(short_factor=LONG)
    assert not isinstance(model.model.rotary_emb, AttentionRotary)
    assert model.config.ropescale["kv_consistent"] is False
    assert max_diff(*cached_vs_full(model, ids, prompt=48)) < TOL
    with pytest.raises(ValueError, match="longrope with short_factor != long_factor"):
        _longrope(short_factor=LONG, kv_consistent=True)


def test_save_and_reload_keep_the_mode(tmp_path, ids):
    model = _longrope(short_factor=SHORT)
    ropescale.save_pretrained(model, tmp_path / "ckpt")
    again = ropescale.from_pretrained(tmp_path / "ckpt", attn_implementation="eager")
    assert isinstance(again.model.rotary_emb, AttentionRotary)
    assert max_diff(*cached_vs_full(again, ids, prompt=48)) < TOL


def test_patch_summary_says_the_cached_keys_follow(tmp_path, capsys):
    from ropescale.cli.main import main

    tiny_model().save_pretrained(tmp_path / "m")
    capsys.readouterr()
    argv = ["patch", "--model", str(tmp_path / "m"), "--method", "longrope", "--factor", "4"]
    assert main([*argv, "--param", f"long_factor={LONG}", "--param", f"short_factor={SHORT}"]) == 0
    assert "+ KV-consistent attention (cached keys follow the current frequencies" in capsys.readouterr().out
    assert main([*argv, "--param", f"long_factor={LONG}", "--param", f"short_factor={LONG}"]) == 0
    assert "KV-consistent" not in capsys.readouterr().out
