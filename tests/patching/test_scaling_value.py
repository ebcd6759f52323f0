"""The one scaling value (issue 53): every edge builds a :class:`ropescale.scaling.Scaling`, and the keyword
form the public functions have always taken builds the same one."""

from __future__ import annotations

import json

import pytest
import torch

import ropescale
from ropescale.methods import get_method
from ropescale.patching.model import patch_config
from ropescale.patching.plan import plan_patch, plan_scaling
from ropescale.scaling import Scaling
from tests.conftest import tiny_config, tiny_model


def test_the_patch_options_leave_the_method_parameters_for_their_fields():
    s = Scaling.of("dynamic_yarn", 4, 2048, sliding_window=None, kv_consistent=True, beta_fast=16, shipped_context=9000)
    assert s.params == {"beta_fast": 16}
    assert (s.kv_consistent, s.shipped_context, s.original_context, s.sliding_window) == (True, 9000, 2048, None)
    assert Scaling.of("yarn", 2, compose=True).start == "compose" and Scaling.of("yarn", 2, None, True).replace
    assert Scaling.of("saved").as_saved and Scaling.of("none").unscaled


@pytest.mark.parametrize("params", [{"compose": True}, {"kv_consistent": False}, {"factor": 2}])
def test_an_option_among_the_method_parameters_of_the_value_is_refused(params):
    with pytest.raises(ValueError, match="is a field of the scaling"):
        Scaling("yarn", 2, params)


def test_compose_and_replace_together_are_refused():
    with pytest.raises(ValueError, match="give --compose or --replace, not both"):
        Scaling.of("yarn", 2, None, True, compose=True)


def test_a_method_object_takes_no_factor_beside_it():
    with pytest.raises(ValueError, match="either a ScalingMethod instance"):
        Scaling(get_method("yarn", factor=2), 4)


def test_the_value_survives_json():
    s = Scaling.of("yarn", 4, 4096, True, None, target_length=None, beta_fast=16, kv_consistent=False)
    text = json.dumps(s.to_json())
    assert Scaling.from_json(json.loads(text)) == s
    with pytest.raises(ValueError, match="no field 'colour'"):
        Scaling.from_json({"method": "yarn", "colour": 1})


def test_the_value_and_the_keyword_form_plan_the_same():
    config = tiny_config()
    by_keywords = plan_patch(config, "yarn", 4, beta_fast=16)
    by_value = plan_scaling(config, Scaling("yarn", 4, {"beta_fast": 16}))
    assert by_value == by_keywords
    assert plan_patch(config, Scaling("yarn", 4, {"beta_fast": 16})) == by_keywords


def test_a_value_with_keywords_beside_it_is_refused():
    with pytest.raises(ValueError, match="give a Scaling or the method with its arguments, not both"):
        plan_patch(tiny_config(), Scaling("yarn", 4), 2)


def test_patch_takes_the_value_and_rotates_as_the_keywords_do():
    a, b = tiny_model(), tiny_model()
    ropescale.patch(a, "yarn", 4, beta_fast=16)
    ropescale.patch(b, Scaling("yarn", 4, {"beta_fast": 16}))
    assert torch.equal(a.model.rotary_emb.inv_freq, b.model.rotary_emb.inv_freq)
    assert a.config.rope_parameters == b.config.rope_parameters


def test_the_sliding_window_travels_in_the_value():
    config = tiny_config("mistral", sliding_window=32)
    patched = patch_config(config, Scaling("linear", 2, sliding_window=None))
    assert patched.sliding_window is None and config.sliding_window == 32


def test_from_pretrained_takes_the_value(tmp_path):
    tiny_model().save_pretrained(tmp_path)
    model = ropescale.from_pretrained(str(tmp_path), Scaling("linear", 2))
    assert model.config.rope_parameters["rope_type"] == "linear" and model.config.rope_parameters["factor"] == 2
    with pytest.raises(ValueError, match="not both"):
        ropescale.from_pretrained(str(tmp_path), Scaling("linear", 2), factor=4)


def test_ruler_cells_and_search_results_name_the_same_value():
    from ropescale.evals.tasks.ruler import record
    from ropescale.search.artifacts import SearchResult

    assert record.Scaling is Scaling  # the cells' scaling_requested is the value's request()
    assert Scaling("self_extend", 4, {"window": 8}).request() == {
        "method": "self_extend",
        "factor": 4,
        "params": {"window": 8},
    }
    found = SearchResult("yarn", {"factor": 4.0, "beta_fast": 8}, "m", 1.0, None)
    assert found.scaling() == Scaling("yarn", 4.0, {"beta_fast": 8}, start="replace")


def test_the_method_is_built_once_and_asked_once(tmp_path, monkeypatch):
    """The edge's checked method object is the plan's, and the plan asks it for the rotary geometry once:
    writing the config, checking it runs and loading the model read the plan (issue 53's factor path)."""
    from ropescale.methods.yarn import Yarn
    from ropescale.models.loading import load_config

    tiny_model().save_pretrained(tmp_path)
    scaling = Scaling("yarn", 4)
    scaling.check()
    asked = []
    real = Yarn.rope_parameters
    monkeypatch.setattr(Yarn, "rope_parameters", lambda self, spec: asked.append(spec) or real(self, spec))
    plan = plan_scaling(load_config(str(tmp_path)), scaling)
    model = ropescale.from_pretrained(str(tmp_path), plan=plan)
    assert model.config.rope_parameters["factor"] == 4 and plan.native and not plan.custom_rotary
    assert len(asked) == 1
    assert plan.method is scaling.resolved
