"""Every scaling method against an independent oracle.

The oracle is transformers itself: ``ROPE_INIT_FUNCTIONS`` (linear, dynamic, yarn, longrope,
llama3) and ``LlamaRotaryEmbedding.compute_default_rope_parameters``, always fed from a real
``LlamaConfig``, so the comparison also checks that our reading of each config field (which
context is L, which factor is used) matches transformers'. Methods transformers has no name for
are mapped onto ones it has: static NTK = plain RoPE with base b·s^(d/(d−2)); dynamic YaRN at
length ℓ = YaRN with factor max(1, ℓ/L).

The second half holds property checks in the style of transformers' own ``test_modeling_rope_utils``
(linear = default/s, YaRN between default/s and default, ...) and one whole-vector snapshot.
"""

from __future__ import annotations

import math
import random

import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from ropescale.methods import RotarySpec, get_method
from ropescale.methods.yarn import correction_range

HEAD_DIMS = (32, 64, 80, 128)
BASES = (1e4, 5e5)
FACTORS = (1.0, 1.5, 2.0, 4.0, 8.0, 16.0, 32.0)
CONTEXTS = (2048, 4096, 8192)

# fp32 inv_freq: both sides evaluate the same closed form, so they agree to a few ulps (~1e-7).
# atol=0 because the lowest frequencies are ~1e-8 and any absolute tolerance would hide them.
TOL = dict(rtol=1e-6, atol=0.0)

# One test per (head dim, base, factor); the original contexts L are looped inside (fewer items,
# same coverage: a failure message names the L).
GRID = [pytest.param(h, b, s, id=f"d{h}-b{b:.0e}-s{s:g}") for h in HEAD_DIMS for b in BASES for s in FACTORS]
GEOMETRY = [pytest.param(h, b, id=f"d{h}-b{b:.0e}") for h in HEAD_DIMS for b in BASES]


def seq_lens(L: int) -> tuple[int, ...]:
    """Lengths for the dynamic methods: below, at, just above and well above L."""
    return (L // 2, L, L + 1, 3 * L)


def hf_config(rope_parameters: dict, head_dim: int, max_position_embeddings: int) -> transformers.LlamaConfig:
    """A real Llama config carrying ``rope_parameters`` (copied: transformers standardizes it in place)."""
    return transformers.LlamaConfig(
        hidden_size=4 * head_dim,
        num_attention_heads=4,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        rope_parameters=dict(rope_parameters),
    )


def hf_compute(config: transformers.LlamaConfig, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """transformers' ``(inv_freq, attention_factor)`` for ``config`` at ``seq_len``."""
    rope_type = config.rope_parameters["rope_type"]
    if rope_type == "default":
        return LlamaRotaryEmbedding.compute_default_rope_parameters(config, seq_len=seq_len)
    return ROPE_INIT_FUNCTIONS[rope_type](config, seq_len=seq_len)


def hf_rope(
    rope_parameters: dict, head_dim: int, max_position_embeddings: int, seq_len: int | None = None
) -> tuple[torch.Tensor, float]:
    return hf_compute(hf_config(rope_parameters, head_dim, max_position_embeddings), seq_len)


def ntk_base(base: float, factor: float, dim: int) -> float:
    """NTK-aware base b·s^(d/(d−2)) (bloc97), written out here rather than taken from the code under test."""
    return base * factor ** (dim / (dim - 2))


def random_factors(n: int, low: float, high: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    return sorted(rng.uniform(low, high) for _ in range(n))


def assert_same(ours: tuple[torch.Tensor, float], theirs: tuple[torch.Tensor, float], where: str = "") -> None:
    """inv_freq equal to fp32 rounding, attention factor equal; ``where`` names the case on failure."""
    inv_freq, attention = ours
    hf_inv_freq, hf_attention = theirs
    assert inv_freq.dtype == torch.float32
    torch.testing.assert_close(inv_freq, hf_inv_freq, **TOL, msg=lambda m: f"{where}: {m}")
    assert attention == pytest.approx(hf_attention, rel=1e-6), where


# --------------------------------------------------------------------------------------------
# Oracle: transformers over the grid


@pytest.mark.parametrize("head_dim, base", GEOMETRY)
def test_default_matches_transformers(head_dim, base):
    for L in CONTEXTS:
        spec = RotarySpec(head_dim, base, L)
        theirs = hf_rope({"rope_type": "default", "rope_theta": base}, head_dim, L)
        assert_same(get_method("default").compute(spec), theirs, f"L={L}")
        assert_same(get_method("none").compute(spec, seq_len=3 * L), theirs, f"L={L}, seq_len=3L")


@pytest.mark.parametrize("head_dim, base, factor", GRID)
def test_linear_matches_transformers(head_dim, base, factor):
    for L in CONTEXTS:
        spec = RotarySpec(head_dim, base, L)
        theirs = hf_rope({"rope_type": "linear", "rope_theta": base, "factor": factor}, head_dim, int(factor * L))
        assert_same(get_method("linear", factor=factor).compute(spec), theirs, f"L={L}")


@pytest.mark.parametrize("head_dim, base, factor", GRID)
def test_ntk_matches_default_with_larger_base(head_dim, base, factor):
    for L in CONTEXTS:
        spec = RotarySpec(head_dim, base, L)
        theirs = hf_rope({"rope_type": "default", "rope_theta": ntk_base(base, factor, head_dim)}, head_dim, L)
        assert_same(get_method("ntk", factor=factor).compute(spec, seq_len=3 * L), theirs, f"L={L}")


@pytest.mark.parametrize("factor, expected", [(2, 20221), (4, 40890), (8, 82685)])
def test_ntk_base_anchors(factor, expected):
    """The NTK bases for d=128, b=1e4 computed by hand (docs/methods.md)."""
    method = get_method("ntk", factor=factor)
    spec = RotarySpec(128, 1e4, 4096)
    assert round(method.scaled_base(spec)) == expected
    # and the frequencies really are plain RoPE at that base: θ'_1 = b'^(−2/128)
    inv_freq, _ = method.compute(spec)
    assert 1 / inv_freq[1].item() ** (128 / 2) == pytest.approx(expected, rel=1e-4)


@pytest.mark.parametrize("head_dim, base, factor", GRID)
def test_dynamic_ntk_matches_transformers(head_dim, base, factor):
    method = get_method("dynamic_ntk", factor=factor)
    # transformers reads L from max_position_embeddings for "dynamic"
    params = {"rope_type": "dynamic", "rope_theta": base, "factor": factor}
    for L in CONTEXTS:
        spec = RotarySpec(head_dim, base, L)
        config = hf_config(params, head_dim, L)
        for seq_len in (None, *seq_lens(L)):
            theirs = hf_compute(config, seq_len)
            assert_same(method.compute(spec, seq_len=seq_len), theirs, f"L={L}, seq_len={seq_len}")


@pytest.mark.parametrize("head_dim, base, factor", GRID)
def test_yarn_matches_transformers(head_dim, base, factor):
    for L in CONTEXTS:
        spec = RotarySpec(head_dim, base, L)
        params = {"rope_type": "yarn", "rope_theta": base, "factor": factor, "original_max_position_embeddings": L}
        theirs = hf_rope(params, head_dim, int(factor * L))
        assert_same(get_method("yarn", factor=factor).compute(spec), theirs, f"L={L}")


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param({"attention_factor": 1.0}, id="attention_factor=1"),
        pytest.param({"attention_factor": 0.75}, id="attention_factor=0.75"),
        pytest.param({"mscale": 1.0, "mscale_all_dim": 1.0}, id="mscale=mscale_all_dim"),
        pytest.param({"mscale": 1.0, "mscale_all_dim": 0.5}, id="mscale=1,all_dim=0.5"),
        pytest.param({"mscale": 0.707, "mscale_all_dim": 0.2}, id="mscale=0.707,all_dim=0.2"),
        pytest.param({"truncate": False}, id="truncate=False"),
        pytest.param({"beta_fast": 16.0, "beta_slow": 2.0}, id="beta=16,2"),
        pytest.param({"beta_fast": 64.0, "beta_slow": 0.5}, id="beta=64,0.5"),
        pytest.param({"beta_fast": 8.0, "beta_slow": 4.0, "truncate": False}, id="beta=8,4,no-truncate"),
    ],
)
@pytest.mark.parametrize("head_dim, base, L", [(64, 1e4, 4096), (128, 5e5, 8192), (80, 1e4, 2048)])
def test_yarn_options_match_transformers(extra, head_dim, base, L):
    spec = RotarySpec(head_dim, base, L)
    for factor in (1.0, 2.0, 8.0, 32.0):
        params = {"rope_type": "yarn", "rope_theta": base, "factor": factor, "original_max_position_embeddings": L}
        theirs = hf_rope({**params, **extra}, head_dim, int(factor * L))
        assert_same(get_method("yarn", factor=factor, **extra).compute(spec), theirs, f"factor={factor}")


@pytest.mark.parametrize(
    "base, L, extra",
    [
        # L/2π > b: the slow end of the ramp lies past pair d/2 − 1 and is clamped at d − 1, not d/2 − 1
        pytest.param(500.0, 8192, {}, id="high-beyond-half"),
        pytest.param(500.0, 8192, {"truncate": False}, id="high-beyond-half-no-truncate"),
        # both correction dims ≤ 0: low == high == 0, the ramp is widened by 0.001 instead of dividing by 0
        pytest.param(1e4, 4096, {"beta_fast": 1000.0, "beta_slow": 700.0}, id="zero-width-ramp"),
        pytest.param(1e4, 4096, {"beta_fast": 1000.0, "beta_slow": 700.0, "truncate": False}, id="negative-range"),
    ],
)
def test_yarn_edge_geometries_match_transformers(base, L, extra):
    spec = RotarySpec(64, base, L)
    params = {"rope_type": "yarn", "rope_theta": base, "factor": 4.0, "original_max_position_embeddings": L}
    inv_freq, attention = get_method("yarn", factor=4, **extra).compute(spec)
    assert torch.isfinite(inv_freq).all()
    assert_same((inv_freq, attention), hf_rope({**params, **extra}, 64, 4 * L))


@pytest.mark.parametrize("head_dim, base", GEOMETRY)
def test_dynamic_yarn_is_yarn_at_length_over_L(head_dim, base):
    # factor is only the target the user reports; it must not cap or change s
    method = get_method("dynamic_yarn", factor=4)
    for L in CONTEXTS:
        spec = RotarySpec(head_dim, base, L)
        for seq_len in (*seq_lens(L), int(2.5 * L), 40 * L):
            s = max(1.0, seq_len / L)
            params = {"rope_type": "yarn", "rope_theta": base, "factor": s, "original_max_position_embeddings": L}
            theirs = hf_rope(params, head_dim, max(seq_len, L))
            assert_same(method.compute(spec, seq_len=seq_len), theirs, f"L={L}, seq_len={seq_len}")


@pytest.mark.parametrize("head_dim, base", GEOMETRY)
def test_dynamic_yarn_is_plain_rope_up_to_L(head_dim, base):
    for L in CONTEXTS:
        spec = RotarySpec(head_dim, base, L)
        theirs = hf_rope({"rope_type": "default", "rope_theta": base}, head_dim, L)
        for seq_len in (None, 1, L // 2, L):
            inv_freq, attention = get_method("dynamic_yarn", factor=8).compute(spec, seq_len=seq_len)
            torch.testing.assert_close(inv_freq, theirs[0], **TOL)
            assert attention == 1.0


@pytest.mark.parametrize("head_dim, base, factor", GRID)
def test_llama3_matches_transformers(head_dim, base, factor):
    for L in CONTEXTS:
        spec = RotarySpec(head_dim, base, L)
        params = {
            "rope_type": "llama3",
            "rope_theta": base,
            "factor": factor,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": L,
        }
        theirs = hf_rope(params, head_dim, int(factor * L))
        assert_same(get_method("llama3", factor=factor).compute(spec), theirs, f"L={L}")


@pytest.mark.parametrize("low, high", [(0.5, 2.0), (2.0, 8.0), (1.0, 32.0)])
@pytest.mark.parametrize("head_dim, base, factor, L", [(128, 5e5, 8.0, 8192), (64, 1e4, 4.0, 2048)])
def test_llama3_freq_factors_match_transformers(low, high, head_dim, base, factor, L):
    spec = RotarySpec(head_dim, base, L)
    params = {
        "rope_type": "llama3",
        "rope_theta": base,
        "factor": factor,
        "low_freq_factor": low,
        "high_freq_factor": high,
        "original_max_position_embeddings": L,
    }
    theirs = hf_rope(params, head_dim, int(factor * L))
    ours = get_method("llama3", factor=factor, low_freq_factor=low, high_freq_factor=high).compute(spec)
    assert_same(ours, theirs)


@pytest.mark.parametrize("head_dim, base, factor", GRID)
def test_longrope_matches_transformers(head_dim, base, factor):
    n = head_dim // 2
    for L in CONTEXTS:
        spec = RotarySpec(head_dim, base, L)
        seed = hash((head_dim, base, factor, L)) % 2**31
        long_factor = random_factors(n, 1.0, factor * 1.5, seed)
        short_factor = random_factors(n, 0.9, 1.5, seed + 1)
        method = get_method("longrope", factor=factor, long_factor=long_factor, short_factor=short_factor)
        params = {
            "rope_type": "longrope",
            "rope_theta": base,
            "factor": factor,
            "original_max_position_embeddings": L,
            "long_factor": long_factor,
            "short_factor": short_factor,
        }
        config = hf_config(params, head_dim, int(factor * L))
        for seq_len in (None, *seq_lens(L)):
            theirs = hf_compute(config, seq_len)
            assert_same(method.compute(spec, seq_len=seq_len), theirs, f"L={L}, seq_len={seq_len}")
        # the lists really switch at L (one list for every length would pass the loop above only by luck)
        short_inv, _ = method.compute(spec, seq_len=L)
        long_inv, _ = method.compute(spec, seq_len=L + 1)
        base_inv = hf_rope({"rope_type": "default", "rope_theta": base}, head_dim, L)[0]
        torch.testing.assert_close(short_inv, base_inv / torch.tensor(short_factor), **TOL)
        torch.testing.assert_close(long_inv, base_inv / torch.tensor(long_factor), **TOL)


@pytest.mark.parametrize("head_dim, L", [(64, 4096), (96, 2048)])
def test_longrope_without_short_factor_is_plain_rope_up_to_L(head_dim, L):
    spec = RotarySpec(head_dim, 1e4, L)
    n = head_dim // 2
    long_factor = random_factors(n, 1.0, 8.0, 0)
    method = get_method("longrope", factor=8, long_factor=long_factor)
    params = {
        "rope_type": "longrope",
        "rope_theta": 1e4,
        "factor": 8.0,
        "original_max_position_embeddings": L,
        "long_factor": long_factor,
        "short_factor": [1.0] * n,
    }
    for seq_len in (None, L, 2 * L):
        assert_same(method.compute(spec, seq_len=seq_len), hf_rope(params, head_dim, 8 * L, seq_len=seq_len))


@pytest.mark.parametrize("attention_factor", [1.0, 1.3])
def test_longrope_attention_factor_given(attention_factor):
    spec = RotarySpec(64, 1e4, 4096)
    long_factor = random_factors(32, 1.0, 4.0, 1)
    method = get_method("longrope", factor=4, long_factor=long_factor, attention_factor=attention_factor)
    params = {
        "rope_type": "longrope",
        "rope_theta": 1e4,
        "factor": 4.0,
        "original_max_position_embeddings": 4096,
        "long_factor": long_factor,
        "short_factor": [1.0] * 32,
        "attention_factor": attention_factor,
    }
    assert_same(method.compute(spec, seq_len=9000), hf_rope(params, 64, 16384, seq_len=9000))


# --- partial rotary: transformers honours rope_parameters["partial_rotary_factor"] in every
# ROPE_INIT_FUNCTIONS entry (not in Llama's default, so default and ntk go through linear at s=1).


def _partial_cases():
    for head_dim, prf in [(64, 0.5), (128, 0.5), (80, 0.5), (128, 0.25), (96, 0.75)]:
        for factor in (1.0, 4.0, 16.0):
            yield pytest.param(head_dim, prf, factor, id=f"d{head_dim}-p{prf}-s{factor:g}")


@pytest.mark.parametrize("head_dim, prf, factor", list(_partial_cases()))
def test_partial_rotary_matches_transformers(head_dim, prf, factor):
    base, L = 1e4, 4096
    spec = RotarySpec(head_dim, base, L, partial_rotary_factor=prf)
    dim = int(head_dim * prf)
    assert spec.dim == dim
    common = {"rope_theta": base, "partial_rotary_factor": prf}
    big = int(factor * L)

    def check(ours, params, max_pos=big, seq_len=None):
        theirs = hf_rope({**common, **params}, head_dim, max_pos, seq_len=seq_len)
        assert theirs[0].shape == (dim // 2,)
        assert_same(ours, theirs)

    check(get_method("default").compute(spec), {"rope_type": "linear", "factor": 1.0})
    check(
        get_method("ntk", factor=factor).compute(spec),
        # NTK's exponent uses the rotary dim d, not head_dim
        {"rope_type": "linear", "factor": 1.0, "rope_theta": ntk_base(base, factor, dim)},
    )
    check(get_method("linear", factor=factor).compute(spec), {"rope_type": "linear", "factor": factor})
    for seq_len in seq_lens(L):
        check(
            get_method("dynamic_ntk", factor=factor).compute(spec, seq_len=seq_len),
            {"rope_type": "dynamic", "factor": factor},
            max_pos=L,
            seq_len=seq_len,
        )
        check(
            get_method("dynamic_yarn", factor=factor).compute(spec, seq_len=seq_len),
            {"rope_type": "yarn", "factor": max(1.0, seq_len / L), "original_max_position_embeddings": L},
        )
    yarn = {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": L}
    check(get_method("yarn", factor=factor).compute(spec), yarn)
    llama3 = {
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": L,
    }
    check(get_method("llama3", factor=factor).compute(spec), llama3)
    long_factor, short_factor = random_factors(dim // 2, 1, factor, 3), random_factors(dim // 2, 1, 1.2, 4)
    longrope = get_method("longrope", factor=factor, long_factor=long_factor, short_factor=short_factor)
    for seq_len in (L, 2 * L):
        check(
            longrope.compute(spec, seq_len=seq_len),
            {
                "rope_type": "longrope",
                "factor": factor,
                "original_max_position_embeddings": L,
                "long_factor": long_factor,
                "short_factor": short_factor,
            },
            seq_len=seq_len,
        )


# --- rope_parameters(): the dict we write into a config must make transformers compute the same thing


def _round_trip_cases():
    n = 32
    yield "default", {}
    yield "linear", {"factor": 4}
    yield "ntk", {"factor": 4}
    yield "dynamic_ntk", {"factor": 4}
    yield "yarn", {"factor": 8}
    yield "yarn", {"factor": 8, "attention_factor": 1.0, "beta_fast": 16, "beta_slow": 2, "truncate": False}
    yield "yarn", {"factor": 8, "mscale": 1.0, "mscale_all_dim": 0.5}
    yield "llama3", {"factor": 8, "low_freq_factor": 1, "high_freq_factor": 4}
    yield "longrope", {"factor": 4, "long_factor": random_factors(n, 1, 4, 5)}
    yield (
        "longrope",
        {
            "factor": 4,
            "long_factor": random_factors(n, 1, 4, 6),
            "short_factor": random_factors(n, 1, 2, 7),
            "attention_factor": 1.1,
        },
    )


@pytest.mark.parametrize("name, params", list(_round_trip_cases()))
def test_rope_parameters_round_trip_through_transformers(name, params):
    spec = RotarySpec(64, 1e4, 4096)
    method = get_method(name, **params)
    rope_parameters = method.rope_parameters(spec)
    assert rope_parameters is not None
    assert rope_parameters["rope_theta"] == pytest.approx(ntk_base(1e4, 4, 64) if name == "ntk" else 1e4)
    max_pos = method.max_position_embeddings(spec)
    assert max_pos == (4096 if name == "dynamic_ntk" else int(method.factor * 4096))
    for seq_len in (None, 2048, 4096, 3 * 4096):
        assert_same(method.compute(spec, seq_len=seq_len), hf_rope(rope_parameters, 64, max_pos, seq_len=seq_len))


@pytest.mark.parametrize("name, params", [c for c in _round_trip_cases() if c[0] not in ("default", "ntk")])
def test_rope_parameters_round_trip_with_partial_rotary(name, params):
    """Patching carries ``partial_rotary_factor`` over into the new dict; list lengths follow d/2.

    (default and ntk are written as rope_type "default", whose Llama implementation ignores
    partial_rotary_factor, so they cannot be checked through Llama.)
    """
    spec = RotarySpec(128, 1e4, 4096, partial_rotary_factor=0.5)  # d = 64, like the lists above
    method = get_method(name, **params)
    rope_parameters = {**method.rope_parameters(spec), "partial_rotary_factor": 0.5}
    max_pos = method.max_position_embeddings(spec)
    for seq_len in (None, 2048, 4096, 3 * 4096):
        theirs = hf_rope(rope_parameters, 128, max_pos, seq_len=seq_len)
        assert theirs[0].shape == (32,)
        assert_same(method.compute(spec, seq_len=seq_len), theirs, f"seq_len={seq_len}")


def test_dynamic_yarn_has_no_transformers_spelling():
    assert get_method("dynamic_yarn", factor=4).rope_parameters(RotarySpec(64, 1e4, 4096)) is None


# --------------------------------------------------------------------------------------------
# Properties (transformers' test_modeling_rope_utils style)


@pytest.mark.parametrize("head_dim, base, factor", GRID[::3])
def test_linear_is_default_over_factor(head_dim, base, factor):
    spec = RotarySpec(head_dim, base, 4096)
    default, _ = get_method("default").compute(spec)
    linear, attention = get_method("linear", factor=factor).compute(spec)
    torch.testing.assert_close(linear, default / factor, **TOL)
    assert attention == 1.0


@pytest.mark.parametrize("factor", [2.0, 8.0, 32.0])
@pytest.mark.parametrize("head_dim, base", GEOMETRY[::3])
@pytest.mark.parametrize("L", CONTEXTS)
def test_dynamic_ntk_is_default_up_to_L_and_grows_beyond(head_dim, base, L, factor):
    spec = RotarySpec(head_dim, base, L)
    default, _ = get_method("default").compute(spec)
    method = get_method("dynamic_ntk", factor=factor)
    for seq_len in (None, 1, L // 2, L):
        inv_freq, attention = method.compute(spec, seq_len=seq_len)
        torch.testing.assert_close(inv_freq, default, **TOL)
        assert attention == 1.0
    previous = default
    for seq_len in (L + 1, 2 * L, 4 * L, 16 * L):
        inv_freq, _ = method.compute(spec, seq_len=seq_len)
        assert inv_freq[0] == 1.0  # highest frequency never moves
        assert (inv_freq[1:] < previous[1:]).all()  # every other one strictly slower as ℓ grows
        previous = inv_freq


@pytest.mark.parametrize("factor", [1.5, 2.0, 4.0, 8.0, 16.0, 32.0])
@pytest.mark.parametrize("head_dim, base", GEOMETRY)
@pytest.mark.parametrize("L", CONTEXTS)
def test_yarn_lies_between_linear_and_default(head_dim, base, L, factor):
    spec = RotarySpec(head_dim, base, L)
    default, _ = get_method("default").compute(spec)
    yarn, _ = get_method("yarn", factor=factor).compute(spec)
    slack = 1e-6 * default  # the ramp blend rounds by an ulp or so
    assert (yarn >= default / factor - slack).all()
    assert (yarn <= default + slack).all()
    torch.testing.assert_close(yarn[0], default[0], **TOL)  # highest frequency kept
    torch.testing.assert_close(yarn[-1], default[-1] / factor, **TOL)  # lowest divided by s
    # and monotone: the ramp never re-extrapolates a slower pair
    ratio = yarn / default  # 1 → 1/s
    assert (ratio[1:] <= ratio[:-1] + 1e-6).all()


@pytest.mark.parametrize(
    "factor, expected", [(1.0, 1.0), (2.0, 1.069), (4.0, 1.139), (8.0, 1.208), (16.0, 1.277), (32.0, 1.347)]
)
def test_yarn_attention_factor(factor, expected):
    spec = RotarySpec(128, 1e4, 4096)
    _, attention = get_method("yarn", factor=factor).compute(spec)
    assert attention == pytest.approx(0.1 * math.log(factor) + 1)
    assert round(attention, 3) == expected  # the hand-computed table of docs/methods.md
    # dynamic YaRN reaches the same temperature at ℓ = s·L
    _, dynamic = get_method("dynamic_yarn", factor=2).compute(spec, seq_len=int(factor * 4096))
    assert dynamic == pytest.approx(attention)


@pytest.mark.parametrize("mscale, mscale_all_dim", [(1.0, 1.0), (0.707, 0.707), (1.0, 0.0001)])
def test_yarn_deepseek_attention_factor(mscale, mscale_all_dim):
    _, attention = get_method("yarn", factor=40, mscale=mscale, mscale_all_dim=mscale_all_dim).compute(
        RotarySpec(64, 1e4, 4096)
    )

    def get_mscale(s, m):
        return 0.1 * m * math.log(s) + 1

    assert attention == pytest.approx(get_mscale(40, mscale) / get_mscale(40, mscale_all_dim))


@pytest.mark.parametrize(
    "L, expected",
    [pytest.param(4096, (20, 46), id="llama2"), pytest.param(8192, (25, 50), id="mistral")],
)
def test_yarn_correction_range_anchors(L, expected):
    spec = RotarySpec(128, 1e4, L)
    assert correction_range(spec, 32, 1, truncate=True) == expected
    low, high = correction_range(spec, 32, 1, truncate=False)
    assert expected[0] < low < expected[0] + 1 and expected[1] - 1 < high < expected[1]
    # the frequencies follow the range: pairs ≤ low kept, pairs ≥ high interpolated, ramp between
    default, _ = get_method("default").compute(spec)
    yarn, _ = get_method("yarn", factor=8).compute(spec)
    ratio = yarn / default
    torch.testing.assert_close(ratio[: expected[0] + 1], torch.ones(expected[0] + 1), **TOL)
    torch.testing.assert_close(ratio[expected[1] :], torch.full((64 - expected[1],), 1 / 8), **TOL)
    middle = ratio[expected[0] + 1 : expected[1]]
    assert ((middle < 1) & (middle > 1 / 8)).all()


def test_llama3_1_keeps_short_wavelengths_and_divides_long_ones():
    L, s, base, d = 8192, 8.0, 5e5, 128
    spec = RotarySpec(d, base, L)
    inv_freq, attention = get_method("llama3", factor=s, low_freq_factor=1, high_freq_factor=4).compute(spec)
    assert attention == 1.0
    theta = [base ** (-2 * i / d) for i in range(d // 2)]  # float64, independent of the code
    kept = interpolated = blended = 0
    for i, t in enumerate(theta):
        wavelen = 2 * math.pi / t
        if wavelen < L / 4:
            assert inv_freq[i].item() == pytest.approx(t, rel=1e-6)
            kept += 1
        elif wavelen > L / 1:
            assert inv_freq[i].item() == pytest.approx(t / s, rel=1e-6)
            interpolated += 1
        else:
            smooth = (L / wavelen - 1) / (4 - 1)
            assert inv_freq[i].item() == pytest.approx((1 - smooth) * t / s + smooth * t, rel=1e-5)
            assert t / s < inv_freq[i].item() < t
            blended += 1
    assert kept and interpolated and blended  # the case exercises all three bands


@pytest.mark.parametrize("factor", [2.0, 4.0, 8.0, 32.0])
@pytest.mark.parametrize("head_dim, base", [(32, 1e4), (64, 1e4), (128, 1e4), (128, 5e5), (80, 5e5)])
def test_ntk_keeps_highest_frequency_and_scales_lowest_like_pi(head_dim, base, factor):
    spec = RotarySpec(head_dim, base, 4096)
    default, _ = get_method("default").compute(spec)
    ntk, attention = get_method("ntk", factor=factor).compute(spec)
    assert attention == 1.0
    assert ntk[0] == 1.0 == default[0]
    # b'^(−(d−2)/d) = b^(−(d−2)/d) · s^(−1): the last pair is exactly PI's
    torch.testing.assert_close(ntk[-1], default[-1] / factor, rtol=1e-5, atol=0.0)
    assert (ntk[1:] < default[1:]).all() and (ntk[1:-1] > default[1:-1] / factor).all()


@pytest.mark.parametrize("factor", [1.0, 2.0, 4.0, 16.0])
@pytest.mark.parametrize("L", CONTEXTS)
def test_longrope_attention_factor(factor, L):
    method = get_method("longrope", factor=factor, long_factor=[1.0] * 32)
    _, attention = method.compute(RotarySpec(64, 1e4, L), seq_len=2 * L)
    expected = 1.0 if factor == 1 else math.sqrt(1 + math.log(factor) / math.log(L))
    assert attention == pytest.approx(expected)


# --------------------------------------------------------------------------------------------
# Snapshot


def test_yarn_snapshot():
    defaults = get_method("yarn", factor=4).params()
    # the snapshot below is only meaningful with these defaults
    assert defaults["beta_fast"] == 32 and defaults["beta_slow"] == 1 and defaults["truncate"] is True
    assert defaults["attention_factor"] is None and defaults["mscale"] is None

    spec = RotarySpec(head_dim=64, base=1e5, original_max_position_embeddings=8192)
    assert correction_range(spec, 32, 1, True) == (10, 20)
    inv_freq, attention = get_method("yarn", factor=4).compute(spec)
    assert inv_freq.shape == (32,) and inv_freq.dtype == torch.float32
    expected = {
        0: 1.00000000e00,
        1: 6.97830585e-01,
        2: 4.86967525e-01,
        3: 3.39820833e-01,
        12: 1.13349322e-02,
        13: 7.21193332e-03,
        14: 4.54567142e-03,
        28: 1.05424126e-05,
        29: 7.35681794e-06,
        30: 5.13381257e-06,
        31: 3.58253143e-06,
    }
    for i, value in expected.items():
        assert inv_freq[i].item() == pytest.approx(value, rel=1e-6), i
    assert attention == pytest.approx(1.138629, abs=1e-6)
