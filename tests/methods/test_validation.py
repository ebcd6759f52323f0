"""User input to the method registry and the rotary spec: names, aliases, parameters, CLI strings.

Everything a user can get wrong must raise ``ValueError`` whose message names the culprit, so the
CLI can print one useful line.
"""

from __future__ import annotations

import math

import pytest

from ropescale.methods import METHODS, RotarySpec, get_method, method_class
from ropescale.methods.basic import NTK, Default, DynamicNTK, Linear
from ropescale.methods.longrope import LongRope
from ropescale.methods.string import STRING_FACTOR
from ropescale.methods.yarn import Yarn

SPEC = RotarySpec(head_dim=64, base=1e4, original_max_position_embeddings=4096)

# The smallest valid parameters for each method besides factor.
REQUIRED = {
    "longrope": {"long_factor": [1.0] * 32},
    "composed": {"base": {"method": "default"}, "on_top": {"method": "yarn"}, "shipped_context": 4096},
}

EXPECTED_NAMES = {
    "default",
    "linear",
    "ntk",
    "dynamic_ntk",
    "yarn",
    "dynamic_yarn",
    "llama3",
    "longrope",
    "self_extend",
    "self_extend_llamacpp",
    "dca",
    "string",
    "composed",
}


def test_registry_holds_the_documented_methods():
    assert set(METHODS) == EXPECTED_NAMES


# --- names


@pytest.mark.parametrize(
    "typo, suggestion", [("yarm", "yarn"), ("lama3", "llama3"), ("linaer", "linear"), ("longrop", "longrope")]
)
def test_unknown_name_suggests_and_lists_known(typo, suggestion):
    with pytest.raises(ValueError) as info:
        get_method(typo, factor=2)
    message = str(info.value)
    assert repr(typo) in message
    assert f"did you mean {suggestion!r}" in message
    for name in EXPECTED_NAMES:
        assert name in message


def test_unknown_name_without_close_match_still_lists_known():
    with pytest.raises(ValueError, match="unknown method 'zzzzzz'") as info:
        get_method("zzzzzz")
    assert "did you mean" not in str(info.value)
    assert all(name in str(info.value) for name in EXPECTED_NAMES)


def test_typo_of_alias_suggests_the_method_it_stands_for():
    with pytest.raises(ValueError, match="did you mean 'dynamic_ntk'"):
        get_method("dynamik")


@pytest.mark.parametrize(
    "alias, cls",
    [
        ("none", Default),
        ("pi", Linear),
        ("dynamic", DynamicNTK),
        ("ntk_aware", NTK),
        ("NTK-aware", NTK),
        ("Dynamic-NTK", DynamicNTK),
        (" YaRN ", Yarn),
        ("PI", Linear),
    ],
)
def test_aliases_and_spellings_resolve(alias, cls):
    assert method_class(alias) is cls
    factor = 1 if cls is Default else 2
    assert type(get_method(alias, factor=factor)) is cls


# --- factor


@pytest.mark.parametrize("bad", [0.5, 0, -1, math.nan, math.inf, -math.inf, "abc", "", None, True, [2]])
@pytest.mark.parametrize("name", sorted(EXPECTED_NAMES))
def test_bad_factor_is_rejected_with_its_name(name, bad):
    with pytest.raises(ValueError, match="factor"):
        get_method(name, factor=bad, **REQUIRED.get(name, {}))


@pytest.mark.parametrize("factor", [2, 1.5, "4"])
def test_default_rejects_any_factor_but_one(factor):
    with pytest.raises(ValueError, match="factor"):
        get_method("default", factor=factor)
    assert get_method("default", factor=1).factor == 1.0
    assert get_method("default", factor="1").factor == 1.0


def test_factor_one_is_allowed_for_every_method():
    for name in EXPECTED_NAMES:
        method = get_method(name, factor=1, **REQUIRED.get(name, {}))
        inv_freq, attention = method.compute(SPEC, seq_len=SPEC.original_max_position_embeddings)
        assert inv_freq.shape == (32,)
        assert attention == (STRING_FACTOR if name == "string" else 1.0)  # STRING's at every length


# --- method-specific parameters


@pytest.mark.parametrize("name", ["yarn", "dynamic_yarn"])
@pytest.mark.parametrize("beta_fast, beta_slow", [(1, 1), (1, 32), (32, 32), (0.5, 1)])
def test_yarn_beta_fast_must_exceed_beta_slow(name, beta_fast, beta_slow):
    with pytest.raises(ValueError, match="beta_fast"):
        get_method(name, factor=4, beta_fast=beta_fast, beta_slow=beta_slow)


@pytest.mark.parametrize("key, value", [("beta_slow", 0), ("beta_slow", -1), ("beta_fast", math.nan)])
def test_yarn_betas_must_be_positive_and_finite(key, value):
    with pytest.raises(ValueError, match=key):
        get_method("yarn", factor=4, **{key: value})


@pytest.mark.parametrize("name", ["yarn", "dynamic_yarn", "longrope"])
@pytest.mark.parametrize("value", [-1.0, 0.0, math.nan, "x"])
def test_bad_attention_factor(name, value):
    with pytest.raises(ValueError, match="attention_factor"):
        get_method(name, factor=4, attention_factor=value, **REQUIRED.get(name, {}))


@pytest.mark.parametrize("params", [{"mscale": 1.0}, {"mscale_all_dim": 1.0}, {"mscale": 1.0, "mscale_all_dim": None}])
def test_yarn_mscale_needs_mscale_all_dim(params):
    with pytest.raises(ValueError, match="mscale"):
        get_method("yarn", factor=4, **params)


@pytest.mark.parametrize("params", [{"mscale": -1, "mscale_all_dim": 1}, {"mscale": 1, "mscale_all_dim": 0}])
def test_yarn_mscale_must_be_positive(params):
    with pytest.raises(ValueError, match="mscale"):
        get_method("yarn", factor=4, **params)


@pytest.mark.parametrize("low, high", [(4, 1), (2, 2), (1, 0.5)])
def test_llama3_high_freq_factor_must_exceed_low(low, high):
    with pytest.raises(ValueError, match="high_freq_factor"):
        get_method("llama3", factor=8, low_freq_factor=low, high_freq_factor=high)


@pytest.mark.parametrize("key", ["low_freq_factor", "high_freq_factor"])
@pytest.mark.parametrize("value", [0, -1, math.inf])
def test_llama3_freq_factors_must_be_positive_and_finite(key, value):
    with pytest.raises(ValueError, match=key):
        get_method("llama3", factor=8, **{key: value})


def test_longrope_needs_long_factor():
    with pytest.raises(ValueError, match="long_factor"):
        get_method("longrope", factor=4)
    with pytest.raises(ValueError, match="long_factor"):
        get_method("longrope", factor=4, long_factor=None)


@pytest.mark.parametrize("key", ["long_factor", "short_factor"])
@pytest.mark.parametrize("bad", [[1.0, -2.0], [1.0, 0.0], [1.0, math.nan], "1,x", 3.0])
def test_longrope_list_entries_must_be_positive_numbers(key, bad):
    params = {"long_factor": [1.0, 1.0], key: bad}
    with pytest.raises(ValueError, match=key):
        get_method("longrope", factor=4, **params)


@pytest.mark.parametrize("key, length", [("long_factor", 31), ("long_factor", 64), ("short_factor", 16)])
def test_longrope_list_length_checked_against_the_spec(key, length):
    params = {"long_factor": [1.0] * 32, key: [1.0] * length}
    method = get_method("longrope", factor=4, **params)  # the spec is not known yet: accepted
    for seq_len in (None, 100, 3 * 4096):
        with pytest.raises(ValueError, match=rf"{key} must have 32 entries"):
            method.compute(SPEC, seq_len=seq_len)
    with pytest.raises(ValueError, match=key):
        method.rope_parameters(SPEC)
    # the same lists fit a model whose rotary dim is 2·length
    fits = RotarySpec(head_dim=2 * length, base=1e4, original_max_position_embeddings=4096)
    if key == "long_factor":
        method.compute(fits, seq_len=3 * 4096)


def test_longrope_length_follows_the_rotary_dim_not_head_dim():
    spec = RotarySpec(head_dim=64, base=1e4, original_max_position_embeddings=4096, partial_rotary_factor=0.5)
    get_method("longrope", factor=4, long_factor=[1.0] * 16).compute(spec, seq_len=9000)
    with pytest.raises(ValueError, match="long_factor must have 16 entries"):
        get_method("longrope", factor=4, long_factor=[1.0] * 32).compute(spec, seq_len=9000)


@pytest.mark.parametrize(
    "name, params, unknown",
    [
        ("yarn", {"factor": 4, "beta": 3}, "beta"),
        ("linear", {"factor": 4, "beta_fast": 32}, "beta_fast"),
        ("llama3", {"factor": 8, "low_freq": 1}, "low_freq"),
        ("default", {"rope_theta": 1e4}, "rope_theta"),
        (
            "longrope",
            {"factor": 2, "long_factor": [1.0] * 32, "original_max_position_embeddings": 4096},
            "original_max_position_embeddings",
        ),
    ],
)
def test_unknown_parameter_is_named(name, params, unknown):
    with pytest.raises(ValueError, match=rf"unknown parameter {unknown!r}") as info:
        get_method(name, **params)
    assert "factor" in str(info.value)  # the message lists the parameters that do exist


# --- values from a CLI arrive as strings


def test_cli_strings_are_coerced():
    yarn = get_method("yarn", factor="4", beta_fast="16", beta_slow="2.5", attention_factor="1", truncate="false")
    assert yarn.factor == 4.0 and isinstance(yarn.factor, float)
    assert (yarn.beta_fast, yarn.beta_slow, yarn.attention_factor) == (16.0, 2.5, 1.0)
    assert yarn.truncate is False
    assert yarn == get_method("yarn", factor=4, beta_fast=16, beta_slow=2.5, attention_factor=1.0, truncate=False)

    longrope = get_method("longrope", factor="2", long_factor="1,2,3", short_factor="[1.0, 1.5]")
    assert longrope.long_factor == (1.0, 2.0, 3.0)
    assert longrope.short_factor == (1.0, 1.5)


@pytest.mark.parametrize(
    "text, value",
    [
        ("true", True),
        ("True", True),
        ("1", True),
        ("yes", True),
        ("false", False),
        ("FALSE", False),
        ("0", False),
        ("no", False),
    ],
)
def test_cli_booleans(text, value):
    assert get_method("yarn", factor=2, truncate=text).truncate is value


@pytest.mark.parametrize("text", ["maybe", "2", "", 1.5])
def test_bad_boolean_is_named(text):
    with pytest.raises(ValueError, match="truncate"):
        get_method("yarn", factor=2, truncate=text)


def test_lists_become_tuples_so_methods_stay_hashable_and_comparable():
    a = get_method("longrope", factor=2, long_factor=[1, 2])
    b = get_method("longrope", factor=2, long_factor=(1.0, 2.0))
    assert isinstance(a, LongRope) and a == b and hash(a) == hash(b)
    assert a.params()["long_factor"] == [1.0, 2.0]  # back to a JSON list


def test_methods_are_frozen():
    method = get_method("yarn", factor=4)
    with pytest.raises(AttributeError):
        method.factor = 8


# --- RotarySpec


@pytest.mark.parametrize("head_dim", [63, 1, 0, -64, 64.0, "64", None])
def test_spec_rejects_bad_head_dim(head_dim):
    with pytest.raises(ValueError, match="head_dim|rotary dim"):
        RotarySpec(head_dim=head_dim, base=1e4, original_max_position_embeddings=4096)


@pytest.mark.parametrize("head_dim, partial", [(10, 0.5), (64, 0.03)])
def test_spec_rejects_odd_or_empty_rotary_dim(head_dim, partial):
    with pytest.raises(ValueError, match="rotary dim"):
        RotarySpec(head_dim=head_dim, base=1e4, original_max_position_embeddings=4096, partial_rotary_factor=partial)


@pytest.mark.parametrize("partial", [0, -0.5, 1.5])
def test_spec_rejects_partial_factor_out_of_range(partial):
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        RotarySpec(head_dim=64, base=1e4, original_max_position_embeddings=4096, partial_rotary_factor=partial)


@pytest.mark.parametrize("base", [1, 1.0, 0.5, 0, -1e4, math.nan, math.inf, "1e4", None])
def test_spec_rejects_bad_base(base):
    with pytest.raises(ValueError, match="base"):
        RotarySpec(head_dim=64, base=base, original_max_position_embeddings=4096)


@pytest.mark.parametrize("context", [0, -4096, 4096.0, "4096", None])
def test_spec_rejects_bad_context(context):
    with pytest.raises(ValueError, match="original_max_position_embeddings"):
        RotarySpec(head_dim=64, base=1e4, original_max_position_embeddings=context)


def test_spec_dim():
    assert RotarySpec(64, 1e4, 4096).dim == 64
    assert RotarySpec(80, 1e4, 4096, partial_rotary_factor=0.5).dim == 40
    assert RotarySpec(128, 5e5, 8192, partial_rotary_factor=0.25).dim == 32
    assert RotarySpec(64, 10000, 4096).base_inv_freq().shape == (32,)


# --- one constructor for every method (ScalingMethod.__init__; the classes are dataclass(init=False))


@pytest.mark.parametrize("cls", sorted(set(METHODS.values()), key=lambda c: c.name))
def test_every_method_is_built_by_the_base_constructor(cls):
    """Issue 53 point 4: no method class carries a generated __init__ of its own (that one ran in the
    subclass's module and handed the factor back and forth with the base's checks)."""
    from ropescale.methods.base import ScalingMethod

    assert cls.__init__ is ScalingMethod.__init__


def test_the_base_constructor_takes_what_the_dataclass_one_took():
    assert Yarn(4.0, 16) == Yarn(factor=4.0, beta_fast=16.0) == get_method("yarn", factor=4, beta_fast=16)
    assert Yarn(4.0).beta_slow == 1.0 and Yarn().factor == 1.0
    with pytest.raises(TypeError, match="unexpected keyword argument 'beta'"):
        Yarn(factor=4, beta=2)
    with pytest.raises(TypeError, match="multiple values for argument 'factor'"):
        Yarn(4.0, factor=4.0)
    with pytest.raises(ValueError, match="beta_fast must be > beta_slow, got beta_fast=2 <= beta_slow=3"):
        Yarn(factor=4, beta_fast=2, beta_slow=3)  # a bound declared on the field (bounded), checked by the base
