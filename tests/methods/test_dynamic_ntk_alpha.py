"""Dynamic NTK's two schedules against their closed forms, transformers, and a save/reload.

``alpha="transformers"`` (default): b'(ℓ) = b·(s·ℓ/L − (s−1))^(d/(d−2)), so at ℓ = 4L with s = 4 the
base is static NTK's at 13, not 4. ``alpha="length"``: b'(ℓ) = b·(ℓ/L)^(d/(d−2)), static NTK at
s = ℓ/L. Both are transformers' ``dynamic`` rope type (factor s, or 1), so both save natively.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

import ropescale
from ropescale.cli.main import main
from ropescale.methods import RotarySpec, get_method
from ropescale.patching.plan import original_spec
from tests.conftest import tiny_model

SPEC = RotarySpec(head_dim=64, base=10000.0, original_max_position_embeddings=2048)
L, D = 2048, 64


def closed_form(base: float) -> torch.Tensor:
    return 1.0 / base ** (torch.arange(0, D, 2).float() / D)


@pytest.mark.parametrize("length", [2048, 3000, 4096, 8192, 20000])
def test_length_alpha_is_static_ntk_at_the_current_length(length):
    got, attention = get_method("dynamic_ntk", factor=4, alpha="length").compute(SPEC, length)
    torch.testing.assert_close(got, closed_form(10000.0 * (length / L) ** (D / (D - 2))), rtol=1e-6, atol=0)
    static, _ = get_method("ntk", factor=length / L).compute(SPEC)
    torch.testing.assert_close(got, static, rtol=1e-6, atol=0)
    assert attention == 1.0


def test_transformers_alpha_at_4L_is_static_ntk_at_13():
    got, _ = get_method("dynamic_ntk", factor=4).compute(SPEC, 4 * L)
    torch.testing.assert_close(got, get_method("ntk", factor=13).compute(SPEC)[0], rtol=1e-6, atol=0)
    length, _ = get_method("dynamic_ntk", factor=4, alpha="length").compute(SPEC, 4 * L)
    torch.testing.assert_close(length, get_method("ntk", factor=4).compute(SPEC)[0], rtol=1e-6, atol=0)


@pytest.mark.parametrize("alpha", ["transformers", "length"])
def test_both_are_transformers_dynamic_and_save_natively(alpha, tmp_path):
    model = ropescale.patch(tiny_model(), "dynamic_ntk", factor=4, alpha=alpha, kv_consistent=False)
    rope = model.config.rope_parameters
    assert rope["rope_type"] == "dynamic" and rope["factor"] == (4.0 if alpha == "transformers" else 1.0)
    assert model.config.ropescale["params"] == {"factor": 4.0, "alpha": alpha}
    for length in (64, 100, 256):  # transformers' own function gives ours at every length
        theirs, _ = ROPE_INIT_FUNCTIONS["dynamic"](model.config, None, seq_len=length)
        ours, _ = get_method("dynamic_ntk", factor=4, alpha=alpha).compute(original_spec(model.config), length)
        torch.testing.assert_close(theirs, ours, rtol=1e-6, atol=0)
    ropescale.save_pretrained(model, tmp_path / "out")
    plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()  # no ropescale involved
    again = ropescale.from_pretrained(tmp_path / "out")
    assert again.config.ropescale["params"]["alpha"] == alpha
    ids = torch.randint(0, 128, (1, 200))
    with torch.no_grad():
        want = model(ids).logits
        torch.testing.assert_close(plain(ids).logits, want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(again(ids).logits, want, rtol=1e-5, atol=1e-5)


def test_the_two_schedules_differ_beyond_L_only():
    for length in (1000, 2048):
        a = get_method("dynamic_ntk", factor=4).compute(SPEC, length)[0]
        b = get_method("dynamic_ntk", factor=4, alpha="length").compute(SPEC, length)[0]
        assert torch.equal(a, b)
    a = get_method("dynamic_ntk", factor=4).compute(SPEC, 3 * L)[0]
    b = get_method("dynamic_ntk", factor=4, alpha="length").compute(SPEC, 3 * L)[0]
    assert (a[1:] < b[1:]).all()  # transformers' larger α interpolates more


def test_bad_alpha_and_the_methods_listing(capsys):
    with pytest.raises(ValueError, match="alpha must be one of transformers, length, got 'tokens'"):
        get_method("dynamic_ntk", factor=4, alpha="tokens")
    assert main(["methods", "--verbose"]) == 0
    lines = capsys.readouterr().out.splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith("dynamic_ntk "))
    end = next((i for i in range(start + 1, len(lines)) if lines[i][:1].strip()), len(lines))  # the next method
    entry = " ".join(x.strip() for x in lines[start:end])  # the summary wraps under its column
    assert (
        "alpha=transformers: base as static NTK at s·ℓ/L−(s−1)" in entry
        and "alpha=length: as static NTK at ℓ/L" in entry
    )
    assert "parameters: factor=<required>, alpha=transformers" in entry  # the default
