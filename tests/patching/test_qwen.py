"""Qwen2 and Qwen3 are on the supported list: patch, save, reload, and compare with transformers.

For each method, a tiny random Qwen model patched by ropescale must give the logits of the same
weights in a plain transformers model built from rope parameters written out by hand here (the
formulas' own parameters, not ropescale's output), and must reload from its saved checkpoint with
the same logits: in plain transformers for native methods, through ropescale for the others.
"""

from __future__ import annotations

import pytest
import torch
import transformers

import ropescale
from tests.conftest import ORIGINAL_CONTEXT, tiny_model

L, THETA, D = ORIGINAL_CONTEXT, 10000.0, 16  # original context, base, rotary dim of the tiny models
LONG = [1.0, 1.2, 1.6, 2.2, 3.0, 3.6, 4.0, 4.4]

#: method → (ropescale kwargs, hand-written rope_parameters, max_position_embeddings)
NATIVE = {
    "linear": ({}, {"rope_type": "linear", "rope_theta": THETA, "factor": 4.0}, 4 * L),
    "ntk": ({}, {"rope_type": "default", "rope_theta": THETA * 4.0 ** (D / (D - 2))}, 4 * L),
    "dynamic_ntk": ({}, {"rope_type": "dynamic", "rope_theta": THETA, "factor": 4.0}, L),
    "yarn": (
        {},
        {"rope_type": "yarn", "rope_theta": THETA, "factor": 4.0, "original_max_position_embeddings": L},
        4 * L,
    ),
    "llama3": (
        {},
        {
            "rope_type": "llama3",
            "rope_theta": THETA,
            "factor": 4.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": L,
        },
        4 * L,
    ),
    "longrope": (
        {"long_factor": LONG},
        {
            "rope_type": "longrope",
            "rope_theta": THETA,
            "factor": 4.0,
            "original_max_position_embeddings": L,
            "long_factor": LONG,
            "short_factor": [1.0] * 8,
        },
        4 * L,
    ),
}


def qwen(arch: str, seed: int = 0, **overrides):
    """The tests' tiny random model (L = 64, base 1e4, head_dim 16) of a Qwen architecture."""
    return tiny_model(arch, seed, **overrides)


@pytest.fixture
def ids():
    torch.manual_seed(1)
    return torch.randint(0, 128, (2, 200))  # beyond 3L


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
@pytest.mark.parametrize("method", sorted(NATIVE))
def test_native_methods_equal_hand_written_transformers_and_reload(arch, method, ids, tmp_path):
    params, rope, max_positions = NATIVE[method]
    patched = ropescale.patch(qwen(arch), method, factor=4, **params)
    native = qwen(arch, rope_parameters=rope, max_position_embeddings=max_positions)
    native.load_state_dict(qwen(arch).state_dict())
    want = _logits(native, ids)
    torch.testing.assert_close(_logits(patched, ids), want, rtol=1e-5, atol=1e-5)
    ropescale.save_pretrained(patched, tmp_path / "ckpt")
    plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt", attn_implementation="eager").eval()
    assert type(plain) is type(native)
    torch.testing.assert_close(_logits(plain, ids), want, rtol=1e-5, atol=1e-5)
    again = ropescale.from_pretrained(tmp_path / "ckpt", attn_implementation="eager")
    torch.testing.assert_close(_logits(again, ids), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
@pytest.mark.parametrize("method", ["dynamic_yarn", "self_extend"])
def test_non_native_methods_reload_through_ropescale(arch, method, ids, tmp_path):
    patched = ropescale.patch(qwen(arch), method, factor=4)
    want = _logits(patched, ids)
    assert not torch.allclose(want, _logits(qwen(arch), ids), atol=1e-4)  # the scaling acts
    ropescale.save_pretrained(patched, tmp_path / "ckpt")
    with pytest.raises(ValueError, match="trust_remote_code"):
        transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt")
    again = ropescale.from_pretrained(tmp_path / "ckpt", attn_implementation="eager")
    torch.testing.assert_close(_logits(again, ids), want, rtol=1e-5, atol=1e-5)


def test_qwen2_sliding_window_is_kept_or_removed():
    model = qwen("qwen2", use_sliding_window=True, sliding_window=32, max_window_layers=0)
    with pytest.warns(UserWarning, match="sliding_window=32 is smaller than the extended context 256"):
        ropescale.patch(model, "yarn", factor=4)
    ropescale.patch(model, "yarn", factor=4, replace=True, sliding_window=None)
    assert model.config.sliding_window is None
