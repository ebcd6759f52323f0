"""Issue 53, point 4: the factor's path through the code (``benchmarks/house_numbers.py --path``). A method is
built, checked and asked in one module, and loading applies a finished plan without asking the planner again."""

from __future__ import annotations

import sys
from collections.abc import Callable

import ropescale
from ropescale.methods import RotarySpec, get_method
from ropescale.models.loading import load_config
from ropescale.patching.plan import plan_scaling
from ropescale.scaling import Scaling
from tests.conftest import tiny_model


def _modules_run(call: Callable[[], object]) -> set[str]:
    """The ropescale modules whose functions run during ``call()``."""
    seen: set[str] = set()

    def profile(frame, event, arg):
        name = frame.f_globals.get("__name__", "")
        if event == "call" and name.startswith("ropescale"):
            seen.add(name)

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return seen


def test_a_method_is_built_checked_and_asked_in_the_base_alone():
    """YaRN declares its fields, their bounds and its rope_parameters keys; building it and asking it for the
    rotary geometry run methods/base.py only (before: yarn's generated __init__, then base, then yarn's
    validate and rope_parameters, each handing the factor back)."""
    built = []
    assert _modules_run(lambda: built.append(get_method("yarn", factor=4.0, beta_fast=16))) <= {
        "ropescale.methods.registry",  # the name looked up, before any value is held
        "ropescale.methods.base",
    }
    rotary = []
    assert _modules_run(lambda: rotary.append(built[0].on(RotarySpec(64, 10000.0, 2048)))) == {"ropescale.methods.base"}
    assert rotary[0].rope_parameters == {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 2048,
        "beta_fast": 16.0,
        "beta_slow": 1.0,
        "truncate": True,
    }


def test_loading_a_finished_plan_asks_the_planner_nothing(tmp_path):
    """from_pretrained(plan=...) writes the plan (patching/model.py) and loads; it no longer calls back into
    patching/plan.py, which decided the plan and is done."""
    tiny_model().save_pretrained(tmp_path)
    plan = plan_scaling(load_config(str(tmp_path)), Scaling("yarn", 4).checked())
    models = []
    modules = _modules_run(lambda: models.append(ropescale.from_pretrained(str(tmp_path), plan=plan)))
    assert "ropescale.patching.model" in modules and "ropescale.patching.plan" not in modules
    assert models[0].config.rope_parameters["factor"] == 4
