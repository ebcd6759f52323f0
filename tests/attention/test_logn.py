"""The log-length query scale of the attention-level methods (``logn=true``): the formula, nothing
changes within the trained context, beyond it the method equals itself with each query scaled by
ln(p + 1) / ln(L) written out in Python, and cached decoding still equals recomputation."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AttentionInterface

import ropescale
from ropescale.attention.function import logn_scale
from ropescale.attention.rotate_on_read import rotary_of
from ropescale.methods import get_method
from tests.attention.decoding import assert_padded_batch_equals_rows_alone, cached_vs_full, max_diff
from tests.conftest import ORIGINAL_CONTEXT, tiny_model

L = ORIGINAL_CONTEXT
METHODS = {
    "self_extend": dict(group_size=6, window=16),
    "dca": dict(chunk_size=48, local_window=8, temperature=False),  # its temperature: test_reference_methods.py
    "string": dict(shift=20, local_window=4, frequencies="yarn"),
}


def logits(model, ids):
    with torch.no_grad():
        return model(ids, use_cache=False).logits


def test_the_scale_is_one_within_the_context_and_log_length_beyond():
    got = logn_scale(torch.tensor([0, 1, L - 2, L - 1, L, 2 * L - 1, 4 * L - 1]), L, torch.float64)
    expected = [
        1.0,
        1.0,
        1.0,
        1.0,
        math.log(L + 1) / math.log(L),
        math.log(2 * L) / math.log(L),
        1 + math.log(4) / math.log(L),
    ]
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-12)


def test_it_is_a_parameter_of_the_attention_level_methods_only():
    for name in METHODS:
        assert get_method(name, logn="true").logn is True and get_method(name).logn is False
    with pytest.raises(ValueError, match="logn must be true or false"):
        get_method("self_extend", logn="sometimes")
    with pytest.raises((TypeError, ValueError)):
        get_method("yarn", factor=2, logn=True)


@pytest.mark.parametrize("name", METHODS)
def test_nothing_changes_within_the_trained_context(name, long_input):
    plain = ropescale.patch(tiny_model(), name, factor=4, **METHODS[name])
    scaled = ropescale.patch(tiny_model(state_dict=plain.state_dict()), name, factor=4, logn=True, **METHODS[name])
    ids = long_input[:, :L]
    torch.testing.assert_close(logits(scaled, ids), logits(plain, ids), rtol=0, atol=0)
    assert not torch.allclose(logits(scaled, long_input), logits(plain, long_input), atol=1e-4)  # beyond L it acts


def scaled_reference(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The method's own attention, logn off, with every query row multiplied by ln(p + 1) / ln(L)."""
    rotary = rotary_of(module)
    rows = [max(1.0, math.log(p + 1) / math.log(L)) for p in kwargs["position_ids"][0].tolist()]
    query = query * torch.tensor(rows, dtype=query.dtype)[None, None, :, None]
    context, rotary.logn_context = rotary.logn_context, None
    try:
        return AttentionInterface()[rotary.attention_name_before_reference](
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    finally:
        rotary.logn_context = context


REFERENCE = "ropescale_test_logn_reference"
AttentionInterface.register(REFERENCE, scaled_reference)


@pytest.mark.parametrize("name", METHODS)
def test_beyond_the_context_it_is_the_method_with_scaled_queries(name, long_input):
    model = ropescale.patch(tiny_model(), name, factor=4, logn=True, **METHODS[name])
    got = logits(model, long_input)
    rotary = model.model.rotary_emb
    rotary.attention_name_before_reference = model.config._attn_implementation
    model.set_attn_implementation(REFERENCE)
    rotary.attention_name = REFERENCE  # it too takes unrotated q/k from the layers
    torch.testing.assert_close(got, logits(model, long_input), rtol=0, atol=2e-6)


@pytest.mark.parametrize("name", METHODS)
def test_cached_decoding_equals_recomputation(name):
    torch.manual_seed(5)
    ids = torch.randint(0, 128, (2, 150))
    model = ropescale.patch(tiny_model(num_hidden_layers=3), name, factor=4, logn=True, **METHODS[name])
    cached, full = cached_vs_full(model, ids, prompt=40)  # decoding crosses L = 64
    assert max_diff(cached, full) < 2e-6


def test_left_padded_batch_equals_rows_alone():
    torch.manual_seed(6)
    model = ropescale.patch(tiny_model(), "self_extend", factor=4, logn=True, **METHODS["self_extend"])
    assert_padded_batch_equals_rows_alone(model, short=50, long=90, new_tokens=20)


def test_it_survives_save_and_reload(tmp_path, long_input):
    model = ropescale.patch(tiny_model(), "self_extend", factor=4, logn=True, **METHODS["self_extend"])
    with pytest.warns(UserWarning, match="cannot be expressed outside ropescale"):
        ropescale.save_pretrained(model, tmp_path / "ckpt")
    again = ropescale.from_pretrained(tmp_path / "ckpt")
    assert again.model.rotary_emb.logn_context == L
    torch.testing.assert_close(logits(again, long_input), logits(model, long_input), rtol=0, atol=0)
