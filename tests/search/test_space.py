"""The candidate spaces: seeds equal the closed-form methods, every move keeps the constraints."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import ropescale
from ropescale.methods import RotarySpec, get_method
from ropescale.search.space import LongRopeSpace, YarnSpace, make_space, pair_factors
from tests.conftest import ORIGINAL_CONTEXT, tiny_model

SPEC = RotarySpec(head_dim=64, base=1e5, original_max_position_embeddings=8192)  # SmolLM2-135M's geometry
TINY = RotarySpec(head_dim=16, base=1e4, original_max_position_embeddings=ORIGINAL_CONTEXT)


def test_seed_factors_are_the_closed_form_methods():
    s, d = 4.0, SPEC.dim
    pi, af = pair_factors("linear", SPEC, s, 32768)
    assert pi == [4.0] * 32 and af == 1.0
    ntk, af = pair_factors("ntk", SPEC, s, 32768)
    np.testing.assert_allclose(ntk, [s ** (2 * i / (d - 2)) for i in range(d // 2)], rtol=1e-5)
    assert ntk[0] == 1.0 and af == 1.0
    yarn, af = pair_factors("yarn", SPEC, s, 32768)
    assert af == pytest.approx(0.1 * math.log(4) + 1)
    theta = SPEC.base_inv_freq().double()
    expected = theta / get_method("yarn", factor=s).compute(SPEC)[0].double()
    np.testing.assert_allclose(yarn, expected.numpy(), rtol=1e-6)
    # YaRN keeps the fast pairs and divides every pair whose wavelength exceeds L by s
    assert yarn[0] == 1.0 and yarn[-12:] == [4.0] * 12


def test_floor_covers_exactly_the_pairs_longer_than_the_context():
    space = LongRopeSpace(SPEC, 4.0)
    wavelength = 2 * math.pi / SPEC.base_inv_freq().double().numpy()
    assert (space.lower() == np.where(wavelength > 8192, 4.0, 1.0)).all()
    assert int((space.lower() == 4.0).sum()) == 12  # pairs 20..31 for SmolLM2
    assert (LongRopeSpace(SPEC, 4.0, floor=False).lower() == 1.0).all()


def test_seeds_pi_and_yarn_are_valid_ntk_is_projected_only_under_the_floor():
    space = LongRopeSpace(SPEC, 4.0)
    raw = dict(space.seeds())
    assert space.violations(raw["linear"]) == [] and space.violations(raw["yarn"]) == []
    assert space.violations(raw["ntk"]) == ["long_factor below its lower bound (1, or s past the critical pair)"]
    projected = space.project(raw["ntk"], round_values=False)
    assert space.violations(projected) == []
    assert projected["long_factor"][:20] == raw["ntk"]["long_factor"][:20]  # unchanged below the critical pair
    assert LongRopeSpace(SPEC, 4.0, floor=False).violations(raw["ntk"]) == []


@pytest.mark.parametrize("floor", [True, False])
def test_every_move_keeps_the_constraints(floor):
    space = LongRopeSpace(SPEC, 4.0, floor=floor)
    rng = np.random.default_rng(0)
    population = [space.project(p) for _, p in space.seeds()]
    for step in range(400):
        if step % 4 == 3:
            a, b = rng.choice(len(population), 2, replace=False)
            child = space.crossover(population[a], population[b], rng)
        else:
            child, _ = space.mutate(population[int(rng.integers(len(population)))], rng, scale=0.6)
        lam = np.asarray(child["long_factor"])
        assert space.violations(child) == [], (step, child)
        assert (np.diff(lam) >= 0).all() and lam.min() >= 1.0 and lam.max() <= 1.25 * 4.0
        assert 1.0 <= child["attention_factor"] <= 1.35
        population.append(child)
    # the moves explore: the factors and attention factors found are not all the seeds'
    assert len({space.key(p) for p in population}) > 300


def test_projection_of_arbitrary_vectors():
    space = LongRopeSpace(SPEC, 4.0)
    rng = np.random.default_rng(1)
    for _ in range(50):
        raw = {"long_factor": rng.uniform(0.1, 20, 32), "attention_factor": rng.uniform(0.5, 2)}
        assert space.violations(space.project(raw)) == []


def test_yarn_space_moves_stay_valid():
    space = YarnSpace(SPEC, 4.0)
    rng = np.random.default_rng(0)
    params = dict(space.seeds())["yarn"]
    assert params == {"beta_fast": 32.0, "beta_slow": 1.0, "attention_factor": round(0.1 * math.log(4) + 1, 6)}
    for _ in range(200):
        params, _ = space.mutate(params, rng, scale=0.6)
        assert space.violations(params) == []
        get_method("yarn", **space.method_params(params))  # a valid YaRN


def test_space_rejects_bad_input():
    with pytest.raises(ValueError, match="must be one of longrope, yarn"):
        make_space("linear", SPEC, 4.0)
    with pytest.raises(ValueError, match="factor > 1"):
        LongRopeSpace(SPEC, 1.0)


@pytest.mark.parametrize("name", ["linear", "ntk", "yarn"])
def test_seed_as_longrope_gives_the_methods_logits(name, long_input):
    """A seed is the closed-form method itself, not an approximation (beyond L, where long factors apply)."""
    space = LongRopeSpace(TINY, 4.0, floor=False)
    params = dict(space.seeds())[name]
    reference = ropescale.patch(tiny_model(), name, factor=4)
    searched = ropescale.patch(tiny_model(), "longrope", **space.method_params(params))
    with torch.no_grad():
        torch.testing.assert_close(searched(long_input).logits, reference(long_input).logits, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("attention,expected", [("yarn", 0.1 * math.log(4) + 1), (1.05, 1.05)])
def test_fixed_attention_factor_for_every_candidate(attention, expected):
    space = LongRopeSpace(SPEC, 4.0, attention=attention)
    rng = np.random.default_rng(0)
    seeds = [p for _, p in space.seeds()]
    assert [p["attention_factor"] for p in seeds] == [pytest.approx(expected)] * 3
    params = space.project(seeds[2])
    for _ in range(100):
        params, what = space.mutate(params, rng, scale=0.6)
        assert "attention" not in what and params["attention_factor"] == pytest.approx(expected)
        assert space.violations(params) == []


def test_seed_attention_keeps_each_seeds_own():
    space = LongRopeSpace(SPEC, 4.0, attention="seed")
    assert [p["attention_factor"] for _, p in space.seeds()] == [1.0, 1.0, pytest.approx(1.138629)]
    with pytest.raises(ValueError, match="attention must be"):
        LongRopeSpace(SPEC, 4.0, attention="sometimes")


def test_short_factors_are_a_choice_not_ones():
    """short="long" (default): the searched schedule at every length; "original": the model's own."""
    spec = TINY
    candidate = LongRopeSpace(spec, 4.0).seeds()[2][1]  # the YaRN seed: not all ones
    default = LongRopeSpace(spec, 4.0).method_params(candidate)
    assert default["short_factor"] == default["long_factor"] != [1.0] * 8
    assert LongRopeSpace(spec, 4.0, short="original").method_params(candidate)["short_factor"] == [1.0] * 8
    with pytest.raises(ValueError, match="short must be one of long, original, got 'ones'"):
        LongRopeSpace(spec, 4.0, short="ones")


@pytest.mark.parametrize("short", ["long", "original"])
def test_searched_longrope_generates_across_L_as_it_recomputes(short):
    """Either choice gives cached generation equal to recomputation across L: "long" because
    nothing switches (even in transformers' own mode), "original" through the KV-consistent mode."""
    from tests.attention.decoding import cached_vs_full, max_diff

    spec = TINY
    space = LongRopeSpace(spec, 4.0, short=short)
    params = space.method_params(space.seeds()[2][1])
    model = ropescale.patch(tiny_model(num_hidden_layers=1), "longrope", **params)
    torch.manual_seed(2)
    ids = torch.randint(0, 128, (1, 100))
    assert max_diff(*cached_vs_full(model, ids, prompt=48)) < 2e-6
    if short == "long":
        plain = ropescale.patch(tiny_model(num_hidden_layers=1), "longrope", **params, kv_consistent=False)
        assert max_diff(*cached_vs_full(plain, ids, prompt=48)) < 2e-6
