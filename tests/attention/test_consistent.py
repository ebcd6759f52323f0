"""KV-cache-consistent dynamic scaling: cached decoding against recomputation, and the plumbing.

A tiny model's original context is L = 64; prompts start below it and decoding crosses it, where
dynamic NTK / dynamic YaRN start changing their frequencies at every step.
"""

from __future__ import annotations

import json

import pytest
import torch
import transformers

import ropescale
from ropescale.attention.rotate_on_read import LAYER_ATTR, AttentionRotary
from tests.attention.decoding import assert_padded_batch_equals_rows_alone, cached_vs_full, max_diff
from tests.conftest import ORIGINAL_CONTEXT, tiny_model

L = ORIGINAL_CONTEXT
TOL = 2e-6  # fp32 rounding noise of the logits (observed ~2e-7); stale keys move them by ~1e-3


@pytest.fixture
def ids():
    torch.manual_seed(3)
    return torch.randint(0, 128, (2, L + 36))  # [b, s]: prompt of 48, decoding 52 steps across L


# --- the claim: attention sees every key rotated with the current frequencies


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("arch", ["llama", "mistral"])
@pytest.mark.parametrize("method", ["dynamic_ntk", "dynamic_yarn"])
def test_cached_decoding_equals_recomputation_across_L(method, arch, impl, ids):
    """With one layer every cached K/V is a function of its token alone, so consistency of the
    rotation is the whole story: cached decoding must equal a full pass bit-for-bit up to rounding,
    while transformers' behaviour (keys rotated once, on entry) must not."""
    model = ropescale.patch(tiny_model(arch, num_hidden_layers=1, attn_implementation=impl), method, factor=4)
    cached, full = cached_vs_full(model, ids, prompt=48)
    assert max_diff(cached, full) < TOL
    inconsistent = ropescale.patch(
        tiny_model(arch, num_hidden_layers=1, attn_implementation=impl), method, factor=4, kv_consistent=False
    )
    cached_old, full_old = cached_vs_full(inconsistent, ids, prompt=48)
    steps_below_L = L - 48 + 1  # prefill and the steps that never pass L agree in both modes
    assert max_diff(cached_old[:steps_below_L], full_old[:steps_below_L]) < TOL
    assert max_diff(cached_old, full_old) > 100 * TOL
    torch.testing.assert_close(torch.stack(full), torch.stack(full_old), rtol=0, atol=TOL)  # same model


def test_deeper_layers_keep_what_no_cache_can_fix(ids):
    """With several layers, the cached K/V of layer ≥ 1 come from hidden states computed when
    their token was new (at a shorter length, so other frequencies); a full pass recomputes them.
    No KV cache can remove that part; the consistent mode removes the stale rotation, which is
    most of the error."""
    consistent = ropescale.patch(tiny_model(num_hidden_layers=3), "dynamic_ntk", factor=4)
    inconsistent = ropescale.patch(tiny_model(num_hidden_layers=3), "dynamic_ntk", factor=4, kv_consistent=False)
    error = max_diff(*cached_vs_full(consistent, ids, prompt=48))
    error_old = max_diff(*cached_vs_full(inconsistent, ids, prompt=48))
    assert TOL < error < error_old / 2


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("method", ["dynamic_ntk", "dynamic_yarn"])
def test_non_contiguous_positions_match_rotating_in_the_layers(method, impl):
    """PoSE windows and the search's spread layout skip positions: a full pass over such
    position_ids must rotate every key at its own position, exactly as rotating in the layers
    does (a key taken at its index instead moved the loss of a real model from 46 to 1052)."""
    torch.manual_seed(5)
    ids = torch.randint(0, 128, (2, 40))
    positions = torch.cat((torch.arange(20), torch.arange(150, 170)))[None].expand(2, -1)  # ℓ = 170 > L
    consistent = ropescale.patch(tiny_model(attn_implementation=impl), method, factor=4)
    layers = ropescale.patch(tiny_model(attn_implementation=impl), method, factor=4, kv_consistent=False)
    with torch.no_grad():
        got = consistent(ids, position_ids=positions).logits
        want = layers(ids, position_ids=positions).logits
        shifted = layers(ids, position_ids=positions - 130 * (positions >= 150)).logits  # indices, ℓ = 40
    torch.testing.assert_close(got, want, rtol=0, atol=TOL)
    assert float((got - shifted).abs().max()) > 100 * TOL


def test_key_positions_follow_the_queries_and_assume_a_contiguous_cache():
    from ropescale.attention.rotate_on_read import key_positions

    assert key_positions(torch.arange(6)[None], 6) is None
    assert key_positions(torch.tensor([[4, 5]]), 6) is None  # decoding on a cache of 4
    skipped = torch.tensor([[0, 1, 7, 8]])
    assert torch.equal(key_positions(skipped, 4), skipped)
    assert torch.equal(key_positions(torch.tensor([[9, 12]]), 5), torch.tensor([[6, 7, 8, 9, 12]]))
    assert torch.equal(key_positions(torch.tensor([[1], [3]]), 5), torch.tensor([[0, 0, 0, 0, 1], [0, 0, 1, 2, 3]]))


def test_generate_uses_the_mode(ids):
    """``model.generate`` (its own cache and position handling) gives the teacher-forced result."""
    model = ropescale.patch(tiny_model(num_hidden_layers=1), "dynamic_ntk", factor=4)
    out = model.generate(
        ids[:, :48],
        attention_mask=torch.ones_like(ids[:, :48]),
        max_new_tokens=40,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
        pad_token_id=0,
    )
    _, full = cached_vs_full(model, out.sequences[:, :-1], prompt=48)
    assert max_diff(list(out.logits), full) < TOL


def test_left_padded_batch_equals_rows_alone():
    """Key positions follow each row's own position ids (left padding shifts them). Below L, where
    one batch-wide length cannot change the frequencies, a padded row equals the row alone."""
    torch.manual_seed(4)
    model = ropescale.patch(tiny_model(num_hidden_layers=1, attn_implementation="sdpa"), "dynamic_ntk", factor=4)
    assert_padded_batch_equals_rows_alone(model, short=30, long=46, new_tokens=15)  # ends at 61 < L


# --- the option and its plumbing


def test_on_by_default_for_dynamic_methods_and_opt_out():
    model = ropescale.patch(tiny_model(), "dynamic_ntk", factor=4)
    rotary = model.model.rotary_emb
    assert isinstance(rotary, AttentionRotary) and rotary.mode == "kv_consistent" and rotary.inner == "eager"
    assert model.config._attn_implementation == "ropescale_kv_consistent_eager"
    assert model.config.ropescale["kv_consistent"] is True
    assert all(layer.self_attn.__dict__[LAYER_ATTR] is rotary for layer in model.model.layers)
    assert LAYER_ATTR not in json.dumps(model.config.to_dict())  # nothing of it reaches config.json
    ropescale.patch(model, "dynamic_ntk", factor=4, replace=True, kv_consistent="false")  # CLI-style string
    assert type(model.model.rotary_emb) is transformers.models.llama.modeling_llama.LlamaRotaryEmbedding
    assert model.config._attn_implementation == "eager" and model.config.ropescale["kv_consistent"] is False
    assert not any(LAYER_ATTR in layer.self_attn.__dict__ for layer in model.model.layers)
    assert ropescale.patch(tiny_model(), "yarn", factor=4).config.ropescale["kv_consistent"] is False


def test_static_methods_refuse_it():
    with pytest.raises(ValueError, match="kv_consistent applies to methods whose frequencies change"):
        ropescale.patch(tiny_model(), "yarn", factor=4, kv_consistent=True)
    with pytest.raises(ValueError, match="kv_consistent must be true or false"):
        ropescale.patch(tiny_model(), "dynamic_ntk", factor=4, kv_consistent="maybe")


def test_replacing_the_scaling_restores_the_attention(long_input):
    model = ropescale.patch(tiny_model(), "dynamic_yarn", factor=4)
    ropescale.patch(model, "yarn", factor=4, replace=True)
    fresh = ropescale.patch(tiny_model(state_dict=model.state_dict()), "yarn", factor=4)
    assert model.config._attn_implementation == "eager"
    with torch.no_grad():
        torch.testing.assert_close(model(long_input).logits, fresh(long_input).logits, rtol=0, atol=0)


@pytest.mark.parametrize(
    "method,params", [("dynamic_ntk", {}), ("dynamic_yarn", {}), ("dynamic_ntk", {"kv_consistent": False})]
)
def test_save_and_reload_restore_the_mode(method, params, tmp_path, ids):
    model = ropescale.patch(tiny_model(num_hidden_layers=1), method, factor=4, **params)
    ropescale.save_pretrained(model, tmp_path / "ckpt")
    again = ropescale.from_pretrained(tmp_path / "ckpt", attn_implementation="eager")
    assert type(again.model.rotary_emb) is type(model.model.rotary_emb)
    assert again.config._attn_implementation == model.config._attn_implementation
    cached, full = cached_vs_full(again, ids, prompt=48)
    expected, _ = cached_vs_full(model, ids, prompt=48)
    assert max_diff(cached, expected) == 0
    if params.get("kv_consistent", True):
        assert max_diff(cached, full) < TOL
    if method == "dynamic_ntk":  # still a native checkpoint: plain transformers loads it (its own cache rules)
        saved = json.loads((tmp_path / "ckpt" / "config.json").read_text())
        assert saved["model_type"] == "llama" and saved["rope_parameters"]["rope_type"] == "dynamic"
        assert "_attn_implementation" not in json.dumps(saved)


def test_cli_param_turns_it_off(tmp_path, capsys):
    from ropescale.cli.main import main

    tiny_model().save_pretrained(tmp_path / "tiny")
    code = main(
        [
            "patch",
            "--model",
            str(tmp_path / "tiny"),
            "--method",
            "dynamic_ntk",
            "--factor",
            "4",
            "--param",
            "kv_consistent=false",
            "--output",
            str(tmp_path / "out"),
        ]
    )
    assert code == 0
    assert json.loads((tmp_path / "out" / "config.json").read_text())["ropescale"]["kv_consistent"] is False


def test_switching_the_attention_away_falls_back_to_rotating_in_the_layers(long_input):
    """E.g. S²-Attn during training, or a user's set_attn_implementation: the layers rotate again,
    which is transformers' dynamic NTK exactly (for a full pass)."""
    model = ropescale.patch(tiny_model(), "dynamic_ntk", factor=4)
    model.set_attn_implementation("eager")
    native = tiny_model(
        state_dict=model.state_dict(), rope_parameters={"rope_type": "dynamic", "rope_theta": 1e4, "factor": 4.0}
    )
    with torch.no_grad():
        torch.testing.assert_close(model(long_input).logits, native(long_input).logits, rtol=0, atol=0)
