"""The attention-level methods' grids: seeds are the methods' defaults, moves stay valid and on the
grid, the reach constraint is enforced, and a search ends when the grid is used up."""

from __future__ import annotations

import numpy as np
import pytest

import ropescale
from ropescale.methods import RotarySpec, get_method
from ropescale.search.engine import run_search
from ropescale.search.grid import AttentionSpace
from ropescale.search.objective import Score
from ropescale.search.space import make_space
from tests.conftest import ORIGINAL_CONTEXT, tiny_model

SPEC = RotarySpec(head_dim=64, base=1e5, original_max_position_embeddings=8192)  # SmolLM2-135M's geometry
TINY = RotarySpec(head_dim=16, base=1e4, original_max_position_embeddings=ORIGINAL_CONTEXT)
METHODS = ("self_extend", "dca", "string")


def _on_grid(space: AttentionSpace, params: dict) -> bool:
    return all(params[name] in grid for name, grid in space.grids().items())


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("factor", [2.0, 4.0])
def test_seeds_are_the_methods_defaults_and_valid(method, factor):
    space = make_space(method, SPEC, factor)
    ((label, seed),) = space.seeds()
    assert space.violations(seed) == [] and _on_grid(space, seed)
    defaults = get_method(method, factor=factor).resolved_params(SPEC)
    assert {k: seed[k] for k in ("group_size", "window", "chunk_size", "local_window", "shift") if k in seed} == {
        k: defaults[k] for k in ("group_size", "window", "chunk_size", "local_window", "shift") if k in seed
    }
    if method == "string":  # plain RoPE cannot reach 2L with a shift below L: the seed rotates with YaRN
        assert label == "string+yarn" and seed["frequencies"] == "yarn"


@pytest.mark.parametrize("method", METHODS)
def test_moves_stay_valid_and_on_the_grid(method):
    space = make_space(method, SPEC, 4.0)
    rng = np.random.default_rng(0)
    population = [space.project(p) for _, p in space.seeds()]
    seen = set()
    for step in range(300):
        if step % 4 == 3 and len(population) > 1:
            a, b = rng.choice(len(population), 2, replace=False)
            child = space.crossover(population[a], population[b], rng)
        else:
            child, _ = space.mutate(population[int(rng.integers(len(population)))], rng, 0.25)
        assert space.violations(child) == [], child
        assert _on_grid(space, child)
        seen.add(space.key(child))
        population.append(child)
    assert len(seen) > 10  # the moves do explore the grid


def test_self_extend_reach_shorter_than_the_target_is_a_violation():
    space = AttentionSpace("self_extend", SPEC, 2.0)  # target 16384
    # W = 4096, G = 2: reach 2·(8192 − 4096 + 2048) = 12288 < 16384
    problems = space.violations({"group_size": 2, "window": 4096})
    assert any("reaches 12288 tokens, less than factor 2 x 8192" in p for p in problems), problems
    # G = 3: 3·(4096 + 4096 // 3) = 16383, one token short (the W // G term); G = 4 reaches
    assert "reaches 16383 tokens" in space.violations({"group_size": 3, "window": 4096})[0]
    assert space.violations({"group_size": 4, "window": 4096}) == []
    assert space.project({"group_size": 2, "window": 4096}) == {"group_size": 4, "window": 4096, "logn": False}
    assert "not on the grid" in space.violations({"group_size": 3, "window": 1000})[0]
    for p in space.candidates():  # every point of the grid reaches the target
        assert get_method("self_extend", factor=2.0, **p).reach(SPEC) >= 16384


def test_dca_and_string_orderings_are_violations():
    dca = AttentionSpace("dca", SPEC, 2.0)
    assert any(
        "local_window must be less than half" in p for p in dca.violations({"chunk_size": 2048, "local_window": 1024})
    )
    string = AttentionSpace("string", SPEC, 2.0)
    bad = {"shift": 2730, "local_window": 128, "frequencies": "default"}
    assert any("STRING with plain RoPE reaches" in p for p in string.violations(bad))
    assert string.project(bad)["frequencies"] == "yarn"


@pytest.mark.parametrize("method", METHODS)
def test_a_seed_patches_the_tiny_model(method, long_input):
    space = make_space(method, TINY, 4.0)
    model = ropescale.patch(tiny_model(), space.method, **space.method_params(space.seeds()[0][1]))
    assert model(long_input[:, :100]).logits.isfinite().all()


def test_the_search_ends_when_the_grid_is_used_up(tmp_path):
    space = make_space("dca", TINY, 4.0)
    n = space.size
    assert n == len(space.candidates()) and 20 < n < 80  # logn doubles the grid

    def objective(params):  # a bowl around (40, 2): the moves head there, then fill the grid
        value = abs(params["chunk_size"] - 40) + abs(params["local_window"] - 2) + 0.5 * params["logn"]
        return Score(1.0 + value, 0.0, 1, 0.0)

    history = run_search(space, objective, 1000, tmp_path / "h.json", {"s": 1}, progress=False)
    assert len(history) == n
    assert {space.key(c["params"]) for c in history} == {space.key(c) for c in space.candidates()}
    assert min(history, key=lambda c: c["score"]["ppl"])["params"] == {
        "chunk_size": 40,
        "local_window": 2,
        "logn": False,
    }


@pytest.mark.parametrize("method", METHODS)
def test_every_grid_holds_logn_off_and_on(method, long_input):
    space = make_space(method, TINY, 4.0)
    assert {p["logn"] for p in space.candidates()} == {False, True} and space.seeds()[0][1]["logn"] is False
    on = next(p for p in space.candidates() if p["logn"])
    model = ropescale.patch(tiny_model(), space.method, **space.method_params(on))
    assert model.model.rotary_emb.logn_context == 64
