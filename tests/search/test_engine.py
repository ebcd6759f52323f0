"""The search loop on a cheap synthetic objective: seeds first, never worse than them,
deterministic, resumable after an interruption with the same history, settings checked."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from ropescale.errors import RopescaleError
from ropescale.methods import RotarySpec
from ropescale.search.engine import best_of, load_history, run_search
from ropescale.search.objective import Score
from ropescale.search.space import LongRopeSpace, YarnSpace

SPEC = RotarySpec(head_dim=32, base=1e4, original_max_position_embeddings=512)
SETTINGS = {"model": "synthetic", "target_length": 2048}


class Bowl:
    """A smooth objective with its optimum inside the space (neither PI, NTK nor YaRN), counting calls."""

    def __init__(self, space, stop_after: int | None = None):
        self.space, self.calls, self.stop_after = space, 0, stop_after
        self.seen: list[dict] = []  # the method parameters it was called with, in order
        lower, upper = space.lower(), space.upper
        self.target = np.log(np.maximum.accumulate(np.clip(np.linspace(1.1, 4.6, space.n_pairs), lower, upper)))

    def __call__(self, params):
        if self.stop_after is not None and self.calls >= self.stop_after:
            raise KeyboardInterrupt  # as if the user pressed Ctrl-C during this evaluation
        self.calls += 1
        self.seen.append(params)
        lam = np.log(params["long_factor"])
        loss = float(np.mean((lam - self.target) ** 2)) + (params["attention_factor"] - 1.1) ** 2
        return Score(ppl=math.exp(1 + loss), nll=0.0, tokens=1, seconds=0.0)


def _strip(history):
    return [{k: c[k] for k in ("index", "origin", "params")} | {"ppl": c["score"]["ppl"]} for c in history]


def test_seeds_first_then_moves_that_improve_on_them(tmp_path):
    space = LongRopeSpace(SPEC, 4.0)
    history = run_search(space, Bowl(space), 30, tmp_path / "history.json", SETTINGS, progress=False)
    assert [c["origin"] for c in history[:3]] == ["seed:linear", "seed:ntk", "seed:yarn"]
    best = best_of(history)
    assert best["index"] >= 3  # a move, not a seed, is the best
    loss = [math.log(c["score"]["ppl"]) - 1 for c in history]  # Bowl's distance to its optimum
    assert loss[best["index"]] < 0.9 * min(loss[:3])


class BadSeedSpace(LongRopeSpace):
    """LongRoPE's space with one deliberately bad seed: every pair at the upper bound, attention 1.35."""

    def seeds(self):
        return [("bad", {"long_factor": [self.upper] * self.n_pairs, "attention_factor": 1.35})]


def test_the_moves_improve_a_deliberately_bad_seed(tmp_path):
    """The best being no worse than the seeds is true by construction; this is not: the moves must
    walk from a bad seed towards the optimum."""
    space = BadSeedSpace(SPEC, 4.0)
    history = run_search(space, Bowl(space), 20, tmp_path / "history.json", SETTINGS, progress=False)
    loss = [math.log(c["score"]["ppl"]) - 1 for c in history]
    assert history[0]["origin"] == "seed:bad" and min(loss) < 0.5 * loss[0]
    assert all(space.violations(c["params"]) == [] for c in history)
    assert len({space.key(c["params"]) for c in history}) == len(history)  # nothing evaluated twice


def test_the_objective_scores_exactly_the_recorded_candidates(tmp_path):
    """What is recorded as candidate k (and its score) is what the objective was called with at call k."""
    space = LongRopeSpace(SPEC, 4.0)
    bowl = Bowl(space)
    history = run_search(space, bowl, 12, tmp_path / "history.json", SETTINGS, progress=False)
    assert bowl.seen == [space.method_params(c["params"]) for c in history]
    assert [c["score"]["ppl"] for c in history] == [Bowl(space)(p).ppl for p in bowl.seen]


def test_best_is_the_minimum_of_the_recorded_history(tmp_path):
    space = LongRopeSpace(SPEC, 4.0)
    run_search(space, Bowl(space), 12, tmp_path / "history.json", SETTINGS, progress=False)
    recorded = json.loads((tmp_path / "history.json").read_text())["candidates"]
    assert best_of(recorded)["score"]["ppl"] == min(c["score"]["ppl"] for c in recorded)


def test_interrupted_search_resumes_to_the_same_history(tmp_path):
    space = LongRopeSpace(SPEC, 4.0)
    straight = run_search(space, Bowl(space), 14, tmp_path / "a.json", SETTINGS, seed=3, progress=False)

    interrupted = Bowl(space, stop_after=6)
    with pytest.raises(KeyboardInterrupt):
        run_search(space, interrupted, 14, tmp_path / "b.json", SETTINGS, seed=3, progress=False)
    assert len(json.loads((tmp_path / "b.json").read_text())["candidates"]) == 6  # all finished evaluations kept

    resumed = Bowl(space)
    history = run_search(space, resumed, 14, tmp_path / "b.json", SETTINGS, seed=3, progress=False)
    assert resumed.calls == 8  # the 6 recorded candidates were not evaluated again
    assert _strip(history) == _strip(straight)
    # a larger budget continues the same search
    more = run_search(space, Bowl(space), 16, tmp_path / "b.json", SETTINGS, seed=3, progress=False)
    assert _strip(more[:14]) == _strip(straight) and len(more) == 16


def test_seed_changes_the_moves_not_the_seeds(tmp_path):
    space = LongRopeSpace(SPEC, 4.0)
    a = run_search(space, Bowl(space), 8, tmp_path / "a.json", SETTINGS, seed=0, progress=False)
    b = run_search(space, Bowl(space), 8, tmp_path / "b.json", {**SETTINGS, "seed": 1}, seed=1, progress=False)
    assert _strip(a[:3]) == _strip(b[:3]) and _strip(a[3:]) != _strip(b[3:])


def test_history_of_other_settings_is_refused(tmp_path):
    space = LongRopeSpace(SPEC, 4.0)
    run_search(space, Bowl(space), 4, tmp_path / "history.json", SETTINGS, progress=False)
    with pytest.raises(RopescaleError, match=r"other settings \(target_length\)"):
        load_history(tmp_path / "history.json", {**SETTINGS, "target_length": 4096})


def test_budget_is_validated(tmp_path):
    space = LongRopeSpace(SPEC, 4.0)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="budget"):
            run_search(space, Bowl(space), bad, tmp_path / "h.json", SETTINGS, progress=False)


def test_yarn_space_search(tmp_path):
    space = YarnSpace(SPEC, 4.0)

    def objective(params):  # best near beta_fast=16, beta_slow=2, attention 1.2
        loss = (
            math.log(params["beta_fast"] / 16) ** 2
            + math.log(params["beta_slow"] / 2) ** 2
            + (params["attention_factor"] - 1.2) ** 2
        )
        return Score(math.exp(loss), 0.0, 1, 0.0)

    history = run_search(space, objective, 25, tmp_path / "h.json", SETTINGS, progress=False)
    assert [c["origin"] for c in history[:2]] == ["seed:yarn", "seed:yarn-af1"]
    assert best_of(history)["score"]["ppl"] < history[0]["score"]["ppl"]
    assert all(space.violations(c["params"]) == [] for c in history)
