"""Dual Chunk Attention: the merged attention against the eager reference built from the paper's
position formulas (every path), and the installed method: cached decoding equals recomputation,
padded batches equal rows alone, validation, save/reload."""

from __future__ import annotations

import json

import pytest
import torch

import ropescale
from ropescale.attention import merge as merging
from ropescale.attention.dca import dual_chunk_attention
from ropescale.attention.rotate_on_read import AttentionRotary
from ropescale.methods import RotarySpec, get_method
from tests.attention.decoding import assert_padded_batch_equals_rows_alone, cached_vs_full, max_diff
from tests.attention.references import dca_regions, random_qkv, region_reference
from tests.conftest import ORIGINAL_CONTEXT, tiny_model

TOL = 2e-6
SPEC = RotarySpec(16, 1e4, ORIGINAL_CONTEXT)


def run(q, k, v, q_pos, mask, chunk_size, local_window):
    method = get_method("dca", chunk_size=chunk_size, local_window=local_window)
    rotary = AttentionRotary(method, SPEC, "dca", "sdpa")
    out = dual_chunk_attention(q, k, v, mask, q_pos, rotary, chunk_size, local_window, 0.25)
    return out.transpose(1, 2)  # [b, h, q, d]


def reference(q, k, v, q_pos, k_pos, chunk_size, local_window, key_mask=None):
    regions = dca_regions(q_pos, k_pos, chunk_size, local_window)
    return region_reference(q, k, v, q_pos, k_pos, regions, SPEC.base_inv_freq(), 0.25, key_mask)


@pytest.mark.parametrize("n", [7, 12, 13, 24, 25, 61, 100])
@pytest.mark.parametrize("chunk_size,local_window", [(16, 4), (13, 6)])
def test_prefill_matches_the_reference(n, chunk_size, local_window):
    q, k, v, q_pos, k_pos = random_qkv(n)
    expected = reference(q, k, v, q_pos, k_pos, chunk_size, local_window)
    got = run(q, k, v, q_pos, None, chunk_size, local_window)
    torch.testing.assert_close(got.double(), expected, rtol=0, atol=TOL)


@pytest.mark.parametrize("n", [1, 12, 13, 24, 25, 37, 100])
@pytest.mark.parametrize("chunk_size,local_window", [(16, 4), (13, 6)])
def test_decoding_step_matches_the_reference(n, chunk_size, local_window):
    q, k, v, q_pos, k_pos = random_qkv(n, q_len=1)
    expected = reference(q, k, v, q_pos, k_pos, chunk_size, local_window)
    torch.testing.assert_close(run(q, k, v, q_pos, None, chunk_size, local_window).double(), expected, rtol=0, atol=TOL)


@pytest.mark.parametrize("q_len", [3, 30])
def test_chunked_prefill_takes_the_masked_path(q_len, monkeypatch):
    q, k, v, q_pos, k_pos = random_qkv(70, q_len=q_len)
    expected = reference(q, k, v, q_pos, k_pos, 16, 4)
    torch.testing.assert_close(run(q, k, v, q_pos, None, 16, 4).double(), expected, rtol=0, atol=TOL)
    monkeypatch.setattr(merging, "MASK_BUDGET", 4 * 70)  # and in row blocks
    torch.testing.assert_close(run(q, k, v, q_pos, None, 16, 4).double(), expected, rtol=0, atol=TOL)


def test_padding_follows_positions():
    q, k, v, _, _ = random_qkv(50)
    pad = torch.tensor([0, 7])
    k_pos = (torch.arange(50)[None] - pad[:, None]).clamp(min=0)
    key_mask = torch.arange(50)[None] >= pad[:, None]
    mask = torch.ones(50, 50, dtype=torch.bool).tril()[None, None] & key_mask[:, None, None]
    got = run(q, k, v, k_pos, mask, 16, 4)
    real = key_mask[:, None, :, None]
    expected = reference(q, k, v, k_pos, k_pos, 16, 4, key_mask)
    torch.testing.assert_close(got.double() * real, expected * real, rtol=0, atol=TOL)


def test_the_mask_free_and_masked_paths_agree():
    q, k, v, q_pos, _ = random_qkv(100)
    causal = torch.ones(100, 100, dtype=torch.bool).tril()[None, None]
    torch.testing.assert_close(run(q, k, v, q_pos, causal, 16, 4), run(q, k, v, q_pos, None, 16, 4), rtol=0, atol=TOL)


def test_defaults_and_validation():
    spec = RotarySpec(64, 1e5, 8192)  # SmolLM2-135M
    method = get_method("dca", factor=4)
    common = {"factor": 4.0, "chunk_size": 6144, "logn": False, "temperature": True}
    # ChunkLlama's chunkllama_attn_replace.py: L/8, 0.05; flash_decoding_chunkllama.py: L/16, 0.1
    assert method.resolved_params(spec) == dict(common, local_window=1024, variant="chunkllama")
    assert method.temperature_coefficient() == 0.05
    flash = get_method("dca", factor=4, variant="chunkllama_flash")
    assert flash.resolved_params(spec) == dict(common, local_window=512, variant="chunkllama_flash")
    assert flash.temperature_coefficient() == 0.1
    assert get_method("dca", temperature="false").temperature_coefficient() == 0.0
    assert method.extended_context(spec) == 32768
    assert get_method("dca", chunk_size="48", local_window="8").params() == {
        "factor": 1.0,
        "chunk_size": 48,
        "local_window": 8,
        "logn": False,
        "variant": "chunkllama",
        "temperature": True,
    }
    with pytest.raises(ValueError, match="variant must be one of chunkllama, chunkllama_flash, got 'flash'"):
        get_method("dca", variant="flash")
    with pytest.raises(ValueError, match="chunk_size must be smaller than the original context 64, got 64"):
        ropescale.patch_config(tiny_model().config, "dca", chunk_size=64)
    with pytest.raises(ValueError, match="local_window must be less than half of chunk_size 48, got 24"):
        ropescale.patch_config(tiny_model().config, "dca", local_window=24)
    for bad in (0, -3, 2.5, "x", True):
        with pytest.raises(ValueError, match="local_window must be a positive integer"):
            get_method("dca", local_window=bad)


@pytest.mark.parametrize("arch", ["llama", "mistral"])
def test_cached_decoding_equals_recomputation(arch):
    """Prompt and steps cross chunk boundaries (s = 48 − 4 = 44): intra, successive and inter.

    Without the temperature: with it a token's states depend on the length they were computed at,
    which no cache can reproduce (tests/attention/test_reference_methods.py checks that case)."""
    torch.manual_seed(5)
    ids = torch.randint(0, 128, (2, 150))
    model = ropescale.patch(
        tiny_model(arch, num_hidden_layers=3), "dca", factor=4, variant="chunkllama_flash", temperature=False
    )
    rotary = model.model.rotary_emb
    assert model.config._attn_implementation == "ropescale_dca" and (rotary.chunk_size, rotary.local_window) == (48, 4)
    cached, full = cached_vs_full(model, ids, prompt=40)
    assert max_diff(cached, full) < TOL
    plain = tiny_model(arch, num_hidden_layers=3, state_dict=model.state_dict())
    with torch.no_grad():
        assert not torch.allclose(model(ids).logits, plain(ids).logits, atol=1e-3)  # chunking did change something


def test_left_padded_batch_equals_rows_alone():
    torch.manual_seed(6)
    model = ropescale.patch(tiny_model(attn_implementation="sdpa"), "dca", chunk_size=32, local_window=8)
    assert_padded_batch_equals_rows_alone(model, short=50, long=90, new_tokens=20)


def test_save_reload_and_replace(tmp_path, long_input):
    model = ropescale.patch(tiny_model(), "dca", factor=4, chunk_size=40, local_window=6)
    ropescale.save_pretrained(model, tmp_path / "ckpt")
    saved = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert saved["ropescale"]["method"] == "dca" and saved["max_position_embeddings"] == 256
    again = ropescale.from_pretrained(tmp_path / "ckpt")
    rotary = again.model.rotary_emb
    assert isinstance(rotary, AttentionRotary) and (rotary.chunk_size, rotary.local_window) == (40, 6)
    with torch.no_grad():
        torch.testing.assert_close(again(long_input).logits, model(long_input).logits, rtol=0, atol=0)
    ropescale.patch(again, "yarn", factor=4, replace=True)
    assert again.config._attn_implementation == "sdpa"
