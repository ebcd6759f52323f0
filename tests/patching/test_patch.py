"""Patched models against transformers built with the equivalent native rope_parameters."""

from __future__ import annotations

import copy
import json
import math
import warnings

import pytest
import torch
import transformers

import ropescale
from ropescale.attention.rotary_embedding import ScaledRotaryEmbedding
from ropescale.errors import AlreadyScaledError, UnsupportedModelError
from ropescale.patching.plan import plan_patch
from tests.conftest import ORIGINAL_CONTEXT, tiny_config, tiny_model

L, BASE = ORIGINAL_CONTEXT, 10000.0

# method, factor, extra params, the native rope_parameters transformers should be given (written
# out by hand, independently of ropescale's own mapping), and max_position_embeddings.
NATIVE_CASES = [
    ("linear", 4, {}, {"rope_type": "linear", "rope_theta": BASE, "factor": 4.0}, 4 * L),
    ("ntk", 4, {}, {"rope_type": "default", "rope_theta": BASE * 4 ** (16 / 14)}, 4 * L),
    ("dynamic_ntk", 4, {}, {"rope_type": "dynamic", "rope_theta": BASE, "factor": 4.0}, L),
    (
        "yarn",
        4,
        {},
        {"rope_type": "yarn", "rope_theta": BASE, "factor": 4.0, "original_max_position_embeddings": L},
        4 * L,
    ),
    (
        "yarn",
        8,
        {"beta_fast": 16, "beta_slow": 2, "attention_factor": 1.0},
        {
            "rope_type": "yarn",
            "rope_theta": BASE,
            "factor": 8.0,
            "original_max_position_embeddings": L,
            "beta_fast": 16,
            "beta_slow": 2,
            "attention_factor": 1.0,
        },
        8 * L,
    ),
    (
        "llama3",
        8,
        {},
        {
            "rope_type": "llama3",
            "rope_theta": BASE,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": L,
        },
        8 * L,
    ),
    (
        "longrope",
        4,
        {"long_factor": [1.0, 1.2, 1.5, 2, 2.5, 3, 3.5, 4.0], "short_factor": [1.0] * 8},
        {
            "rope_type": "longrope",
            "rope_theta": BASE,
            "factor": 4.0,
            "original_max_position_embeddings": L,
            "long_factor": [1.0, 1.2, 1.5, 2, 2.5, 3, 3.5, 4.0],
            "short_factor": [1.0] * 8,
        },
        4 * L,
    ),
]
IDS = [f"{c[0]}x{c[1]}" + ("-custom" if c[2] and c[0] == "yarn" else "") for c in NATIVE_CASES]


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2"])
@pytest.mark.parametrize("method,factor,params,native,max_pos", NATIVE_CASES, ids=IDS)
def test_patch_equals_native_transformers(arch, method, factor, params, native, max_pos, long_input):
    patched = ropescale.patch(tiny_model(arch), method, factor=factor, **params)
    reference = tiny_model(
        arch, state_dict=patched.state_dict(), rope_parameters=copy.deepcopy(native), max_position_embeddings=max_pos
    )
    assert patched.config.max_position_embeddings == max_pos
    torch.testing.assert_close(logits(patched, long_input), logits(reference, long_input), rtol=1e-5, atol=1e-5)
    # and the scaling really changed something beyond L (the test can fail)
    plain = tiny_model(arch, state_dict=patched.state_dict())
    assert not torch.allclose(logits(plain, long_input), logits(patched, long_input), atol=1e-4)


@pytest.mark.parametrize("arch", ["llama", "mistral"])
def test_dynamic_yarn_equals_transformers_yarn_at_current_scale(arch, long_input):
    """Dynamic YaRN at length ℓ is static YaRN with s = ℓ/L (transformers builds the oracle)."""
    patched = ropescale.patch(tiny_model(arch), "dynamic_yarn", factor=4)
    assert isinstance(patched.model.rotary_emb, ScaledRotaryEmbedding)
    assert patched.config.max_position_embeddings == L
    for length in (200, 150):
        s = length / L
        native = {"rope_type": "yarn", "rope_theta": BASE, "factor": s, "original_max_position_embeddings": L}
        reference = tiny_model(
            arch, state_dict=patched.state_dict(), rope_parameters=native, max_position_embeddings=length
        )
        torch.testing.assert_close(
            logits(patched, long_input[:, :length]), logits(reference, long_input[:, :length]), rtol=1e-5, atol=1e-5
        )
    # below L: plain RoPE, whatever ran before (no stale temperature from the longer call)
    plain = tiny_model(arch, state_dict=patched.state_dict())
    torch.testing.assert_close(logits(patched, long_input[:, :40]), logits(plain, long_input[:, :40]))


@pytest.mark.parametrize("arch", ["llama", "mistral"])
@pytest.mark.parametrize(
    "method,params",
    [("linear", {}), ("ntk", {}), ("dynamic_ntk", {}), ("yarn", {}), ("llama3", {}), ("dynamic_yarn", {})],
)
def test_save_and_reload_identical(arch, method, params, tmp_path, long_input):
    model = ropescale.patch(tiny_model(arch), method, factor=4, **params)
    expected = logits(model, long_input)
    ropescale.save_pretrained(model, tmp_path / "ckpt")
    again = ropescale.from_pretrained(tmp_path / "ckpt", attn_implementation="eager")
    torch.testing.assert_close(logits(again, long_input), expected, rtol=0, atol=0)
    assert again.config.ropescale["method"] == method
    native = method != "dynamic_yarn"
    saved = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    if native:  # plain transformers, no ropescale involved in loading
        plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt", attn_implementation="eager")
        torch.testing.assert_close(logits(plain, long_input), expected, rtol=0, atol=0)
        assert saved["model_type"] == arch and "auto_map" not in saved
    else:
        assert saved["model_type"] == f"ropescale_{arch}"


def test_non_native_checkpoint_clear_message_in_plain_transformers(tmp_path, long_input):
    model = ropescale.patch(tiny_model(), "dynamic_yarn", factor=4)
    ropescale.save_pretrained(model, tmp_path / "ckpt")
    with pytest.raises(ValueError, match="trust_remote_code=True"):
        transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt", trust_remote_code=False)
    # with remote code allowed, loading is handed to ropescale
    remote = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "ckpt", trust_remote_code=True, attn_implementation="eager"
    )
    assert isinstance(remote.model.rotary_emb, ScaledRotaryEmbedding)
    torch.testing.assert_close(logits(remote, long_input), logits(model, long_input), rtol=0, atol=0)


def test_from_pretrained_patches_at_load_time(tmp_path, long_input):
    base = tiny_model()
    base.save_pretrained(tmp_path / "base")
    loaded = ropescale.from_pretrained(tmp_path / "base", method="yarn", factor=4, attn_implementation="eager")
    assert isinstance(loaded.model.rotary_emb, transformers.models.llama.modeling_llama.LlamaRotaryEmbedding)
    expected = ropescale.patch(tiny_model(state_dict=base.state_dict()), "yarn", factor=4)
    torch.testing.assert_close(logits(loaded, long_input), logits(expected, long_input), rtol=0, atol=0)
    dyn = ropescale.from_pretrained(tmp_path / "base", method="dynamic_yarn", factor=4)
    assert isinstance(dyn.model.rotary_emb, ScaledRotaryEmbedding)


def test_provenance_block():
    model = ropescale.patch(tiny_model(), "yarn", factor=4, beta_fast=24)
    block = model.config.ropescale
    assert block["method"] == "yarn" and block["params"]["beta_fast"] == 24 and block["params"]["factor"] == 4
    assert block["original_max_position_embeddings"] == L and block["original_rope_theta"] == BASE
    assert block["extended_context"] == 4 * L and block["native"] is True
    assert block["version"] == ropescale.__version__
    assert model.config.rope_parameters["original_max_position_embeddings"] == L
    assert model.config.rope_parameters["rope_theta"] == BASE


def test_patch_config_returns_a_copy():
    config = tiny_config()
    new = ropescale.patch_config(config, "linear", factor=2)
    assert config.rope_parameters["rope_type"] == "default" and config.max_position_embeddings == L
    assert new.rope_parameters == {"rope_type": "linear", "rope_theta": BASE, "factor": 2.0}
    assert new.max_position_embeddings == 2 * L


def test_a_training_free_patch_is_replaced_from_original_and_says_so(long_input):
    """A scaling ropescale applied without training is replaced by default (the rule of
    ropescale.patching.shipped), from the original geometry, and the plan says so."""
    model = ropescale.patch(tiny_model(), "yarn", factor=4)
    plan = plan_patch(model.config, "linear", factor=2)
    assert plan.mode == "replace"
    assert plan.start.startswith("replaced the shipped yarn x4 (applied without training: ropescale provenance")
    ropescale.patch(model, "linear", factor=2)
    direct = ropescale.patch(tiny_model(state_dict=model.state_dict()), "linear", factor=2)
    assert model.config.max_position_embeddings == 2 * L  # from the original L, not 4L
    torch.testing.assert_close(logits(model, long_input), logits(direct, long_input), rtol=0, atol=0)
    # replacing an NTK scaling restores the original base before applying the new one
    ntk = ropescale.patch(tiny_model(), "ntk", factor=4)
    ropescale.patch(ntk, "yarn", factor=2, replace=True)
    assert ntk.config.rope_parameters["rope_theta"] == BASE


def test_a_re_patch_with_the_same_method_and_factor_keeps_the_saved_parameters():
    """A checkpoint fine-tuned at YaRN x4 with attention factor 1.07, measured by a suite entry `yarn x4`:
    it is measured as trained (the entry asked for no parameter), not at YaRN's default temperature."""
    saved = ropescale.patch_config(tiny_config(), "yarn", factor=4, attention_factor=1.07, beta_fast=16)
    again = ropescale.patch_config(saved, "yarn", factor=4, replace=True)
    assert again.ropescale["params"]["attention_factor"] == 1.07 and again.ropescale["params"]["beta_fast"] == 16
    unsaid = ropescale.patch_config(saved, "yarn", replace=True)  # no factor either: the saved one too
    assert (unsaid.ropescale["params"]["factor"], unsaid.ropescale["params"]["attention_factor"]) == (4.0, 1.07)
    asked = ropescale.patch_config(saved, "yarn", factor=4, replace=True, attention_factor=1.0)
    assert asked.ropescale["params"]["attention_factor"] == 1.0 and asked.ropescale["params"]["beta_fast"] == 32
    for other in (ropescale.patch_config(saved, "yarn", factor=2, replace=True),
                  ropescale.patch_config(saved, "dynamic_yarn", factor=4, replace=True)):  # fmt: skip
        assert other.ropescale["params"].get("attention_factor") is None  # another scaling: its defaults


def test_natively_scaled_checkpoint_is_detected_and_replaced_from_its_fields():
    native = {"rope_type": "yarn", "rope_theta": BASE, "factor": 4.0, "original_max_position_embeddings": 32}
    config = tiny_config(rope_parameters=native, max_position_embeddings=128)
    with pytest.raises(AlreadyScaledError):
        ropescale.patch_config(config, "yarn", factor=8)
    new = ropescale.patch_config(config, "yarn", factor=8, replace=True)
    assert new.rope_parameters["original_max_position_embeddings"] == 32 and new.max_position_embeddings == 256
    linear = tiny_config(
        rope_parameters={"rope_type": "linear", "rope_theta": BASE, "factor": 2.0}, max_position_embeddings=128
    )
    assert (
        ropescale.patch_config(linear, "yarn", factor=4, replace=True).ropescale["original_max_position_embeddings"]
        == 64
    )


def test_mistral_sliding_window():
    config = tiny_config("mistral", sliding_window=32)
    with pytest.warns(UserWarning, match="sliding_window=32 is smaller than the extended context 256"):
        kept = ropescale.patch_config(config, "yarn", factor=4)
    assert kept.sliding_window == 32
    assert ropescale.patch_config(config, "yarn", factor=4, sliding_window=None).sliding_window is None
    assert ropescale.patch_config(config, "yarn", factor=4, sliding_window=256).sliding_window == 256
    with pytest.raises(ValueError, match="sliding_window"):
        ropescale.patch_config(config, "yarn", factor=4, sliding_window=-3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # wide enough: no warning
        ropescale.patch_config(tiny_config("mistral", sliding_window=4096), "yarn", factor=4)


def test_model_without_rope_and_unsupported_architecture():
    gpt2 = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2)
    with pytest.raises(UnsupportedModelError, match="no rotary position embedding"):
        ropescale.patch_config(gpt2, "yarn", factor=4)
    phi3 = transformers.Phi3Config(hidden_size=32, num_attention_heads=2, num_hidden_layers=1)
    with pytest.raises(UnsupportedModelError, match="not supported; supported: llama, mistral"):
        ropescale.patch_config(phi3, "yarn", factor=4)


def test_bf16_model_keeps_fp32_frequencies():
    model = tiny_model().to(torch.bfloat16)
    ropescale.patch(model, "yarn", factor=4)
    assert model.model.rotary_emb.inv_freq.dtype == torch.float32
    dyn = ropescale.patch(tiny_model().to(torch.bfloat16), "dynamic_yarn", factor=4)
    assert dyn.model.rotary_emb.inv_freq.dtype == torch.float32
    out = dyn(torch.randint(0, 128, (1, 100))).logits
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()


def test_partial_rotary_factor_is_carried():
    config = tiny_config("llama")
    config.rope_parameters["partial_rotary_factor"] = 0.5
    new = ropescale.patch_config(config, "yarn", factor=4)
    assert new.rope_parameters["partial_rotary_factor"] == 0.5
    assert math.isclose(new.ropescale["original_rope_theta"], BASE)
