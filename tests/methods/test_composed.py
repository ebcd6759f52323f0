"""A method composed on a shipped scaling, against a reference written from the rule in docs/methods.md
("Composing on a shipped scaling"), in numpy and without ropescale's helpers:

1. the shipped frequencies θ'_i and attention factor a₁ (here Llama 3.1's llama3 formula, written out);
2. each pair's effective index i* = −d·ln θ'_i / (2·ln b);
3. the second method's ratio measured from the shipped context L_s (YaRN: a linear ramp in i* between
   floor(d·ln(L_s/(2π·β_fast))/(2 ln b)) and ceil(d·ln(L_s/(2π·β_slow))/(2 ln b)); NTK: s^(−2i*/(d−2));
   linear: 1/s);
4. θ''_i = θ'_i · ratio_i, attention factor a₁ · (0.1 ln s + 1) for YaRN.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from ropescale.methods import RotarySpec, get_method
from ropescale.methods.composed import ATTENTION_ON_TOP, ON_TOP, Composed

D, BASE, L, SHIPPED = 128, 500000.0, 8192, 131072
SPEC = RotarySpec(head_dim=D, base=BASE, original_max_position_embeddings=L)
LLAMA31 = {"method": "llama3", "params": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}}


def reference_llama3(theta: np.ndarray) -> np.ndarray:
    """Meta's apply_scaling (meta-llama/llama-models), factor 8, low 1, high 4, from L."""
    wavelen = 2 * math.pi / theta
    smooth = np.clip((L / wavelen - 1.0) / (4.0 - 1.0), 0, 1)
    return (1 - smooth) * theta / 8.0 + smooth * theta


def reference(on_top: str, s: float) -> tuple[np.ndarray, float]:
    theta = BASE ** (-np.arange(0, D, 2) / D)
    shipped = reference_llama3(theta)
    index = -D * np.log(shipped) / (2 * math.log(BASE))
    if on_top == "linear":
        return shipped / s, 1.0
    if on_top == "ntk":
        return shipped * s ** (-2 * index / (D - 2)), 1.0
    low = math.floor(D * math.log(SHIPPED / (2 * math.pi * 32)) / (2 * math.log(BASE)))
    high = math.ceil(D * math.log(SHIPPED / (2 * math.pi * 1)) / (2 * math.log(BASE)))
    ramp = np.clip((index - low) / (high - low), 0, 1)
    return shipped * (ramp / s + 1 - ramp), 0.1 * math.log(s) + 1


@pytest.mark.parametrize("on_top", ["linear", "ntk", "yarn"])
@pytest.mark.parametrize("s", [2.0, 4.0, 8.0])
def test_composition_on_llama3_matches_the_written_rule(on_top, s):
    method = Composed(factor=s, base=LLAMA31, on_top={"method": on_top}, shipped_context=SHIPPED)
    inv_freq, attention = method.compute(SPEC)
    want, want_attention = reference(on_top, s)
    np.testing.assert_allclose(inv_freq.double().numpy(), want, rtol=2e-6)
    assert attention == pytest.approx(want_attention, rel=1e-12)
    assert method.extended_context(SPEC) == int(s * SHIPPED)


@pytest.mark.parametrize("on_top", ON_TOP)
def test_on_plain_rope_a_composition_is_the_method_itself(on_top):
    """The anchor of the rule: with an identity shipped scaling and L_s = L it reduces exactly to the
    second method (at lengths where the dynamic ones rescale, too)."""
    method = Composed(factor=4, base={"method": "default"}, on_top={"method": on_top}, shipped_context=L)
    for length in (L, 3 * L, 5 * L):
        got, got_attention = method.compute(SPEC, seq_len=length)
        want, want_attention = get_method(on_top, factor=4).compute(SPEC, seq_len=length)
        np.testing.assert_allclose(got.double().numpy(), want.double().numpy(), rtol=2e-6)
        assert got_attention == pytest.approx(want_attention, rel=1e-12)


def test_the_attention_factors_multiply():
    """YaRN x2 shipped (a fine-tune trained with its 0.1 ln 2 + 1) and YaRN x2 on top: the product."""
    method = Composed(factor=2, base={"method": "yarn", "params": {"factor": 2.0}}, on_top={"method": "yarn"},
                      shipped_context=2 * L)  # fmt: skip
    _, attention = method.compute(SPEC)
    assert attention == pytest.approx((0.1 * math.log(2) + 1) ** 2, rel=1e-12)


def test_saved_as_longrope_with_equal_factors_and_every_attention_name():
    method = Composed(factor=4, base=LLAMA31, on_top={"method": "yarn"}, shipped_context=SHIPPED)
    rope = method.rope_parameters(SPEC)
    assert rope["rope_type"] == "longrope" and rope["short_factor"] == rope["long_factor"]
    inv_freq, attention = method.compute(SPEC)
    theta = BASE ** (-np.arange(0, D, 2) / D)
    np.testing.assert_allclose(1 / (np.array(rope["long_factor"]) * BASE ** (np.arange(0, D, 2) / D)),
                               inv_freq.double().numpy(), rtol=2e-6)  # fmt: skip
    assert np.all(np.array(rope["long_factor"]) >= 1 - 1e-6) and theta[0] == 1.0
    assert rope["attention_factor"] == rope["short_mscale"] == rope["long_mscale"] == attention
    assert rope["original_max_position_embeddings"] == L and rope["factor"] == 4 * SHIPPED / L


def test_a_dynamic_second_method_is_not_saved_natively():
    method = Composed(factor=4, base=LLAMA31, on_top={"method": "dynamic_yarn"}, shipped_context=SHIPPED)
    assert method.rope_parameters(SPEC) is None and method.max_position_embeddings(SPEC) == SHIPPED


def test_longrope_does_not_compose():
    with pytest.raises(ValueError, match="cannot be composed"):
        Composed(factor=2, base=LLAMA31, on_top={"method": "longrope"}, shipped_context=SHIPPED)


@pytest.mark.parametrize("name", ATTENTION_ON_TOP)
def test_an_attention_method_on_an_identity_scaling_is_the_method(name):
    """The rule's anchor for attention-level methods: on an identity shipped scaling (θ' = θ, L_s = L) the
    composition rotates with the method's own frequencies and factor and measures its sizes in L."""
    identity = {"method": "linear", "params": {"factor": 1.0}}
    composed = Composed(factor=2, base=identity, on_top={"method": name}, shipped_context=L)
    alone = get_method(name, factor=2)
    got, want = composed.compute(SPEC), alone.compute(SPEC)
    np.testing.assert_array_equal(got[0].numpy(), want[0].numpy())
    assert got[1] == want[1] and composed.attention == name and composed.rope_parameters(SPEC) is None
    method, spec = composed.attention_view(SPEC)
    assert method.resolved_params(spec) == alone.resolved_params(SPEC)
    assert composed.extended_context(SPEC) == alone.extended_context(SPEC)


def test_string_with_yarn_on_llama3_is_the_yarn_composition_with_strings_factor():
    """STRING's frequencies=yarn goes on top of the shipped θ' by the frequency rule; its factor is STRING's
    (temperature=string) times the shipped one (1 for llama3)."""
    string = Composed(factor=4, base=LLAMA31, on_top={"method": "string", "params": {"frequencies": "yarn"}},
                      shipped_context=SHIPPED)  # fmt: skip
    yarn = Composed(factor=4, base=LLAMA31, on_top={"method": "yarn"}, shipped_context=SHIPPED)
    np.testing.assert_array_equal(string.compute(SPEC)[0].numpy(), yarn.compute(SPEC)[0].numpy())
    assert string.compute(SPEC)[1] == pytest.approx(0.1 * math.log(2) + 1)
