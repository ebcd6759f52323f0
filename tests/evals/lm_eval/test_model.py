"""The registered ``ropescale`` lm-eval model: loading, scaling, max_length and its arguments."""

from __future__ import annotations

import pytest
import torch

from ropescale.evals import lm_eval as integration
from ropescale.evals.lm_eval.args import default_max_length, split_model_args, trained_context
from tests.evals.lm_eval.conftest import TINY_CONTEXT, lm_eval, make_lm


def test_model_is_registered_as_hflm_subclass():
    from lm_eval.models.huggingface import HFLM

    cls = lm_eval.api.registry.get_model("ropescale")
    assert issubclass(cls, HFLM) and cls.__name__ == "RopescaleLM"
    assert cls is integration.RopescaleLM and integration.MODEL_TARGET == "ropescale.evals.lm_eval.model:RopescaleLM"
    assert cls.__module__ == "ropescale.evals.lm_eval.model"
    assert lm_eval.api.registry.get_model("hf") is HFLM  # lm-eval's own models still resolve


def test_model_patches_and_sets_max_length(tiny_dir):
    lm = make_lm(tiny_dir, method="yarn", factor=4, param_beta_fast=16)
    block = lm.model.config.ropescale
    assert block["method"] == "yarn" and block["params"]["factor"] == 4.0 and block["params"]["beta_fast"] == 16.0
    assert lm.max_length == 4 * TINY_CONTEXT == block["extended_context"] == default_max_length(lm.model.config)
    assert lm.model.config.max_position_embeddings == 4 * TINY_CONTEXT
    assert lm.trained_context == TINY_CONTEXT == trained_context(lm.model.config)
    assert lm.get_model_info()["ropescale"]["method"] == "yarn"
    assert lm.tokenizer.bos_token == "<s>" and lm.device.type == "cpu"


def test_dynamic_method_defaults_to_factor_times_original(tiny_dir):
    # through lm-eval's own argument parsing, as `--model_args` reaches the class
    lm = lm_eval.api.registry.get_model("ropescale").create_from_arg_string(
        f"pretrained={tiny_dir},method=dynamic,factor=4", {"device": "cpu", "batch_size": 2}
    )
    assert lm.model.config.max_position_embeddings == TINY_CONTEXT  # dynamic keeps L in the config
    assert lm.max_length == 4 * TINY_CONTEXT and lm.batch_size == 2


def test_string_values_are_typed_like_the_command_line(tiny_dir):
    """lm-eval leaves values it cannot type as strings: the same parsers as the CLI read them."""
    lm = make_lm(tiny_dir, method="yarn", factor="4.0", max_length=" 1000 ", replace="yes", sliding_window="KEEP")
    assert lm.model.config.ropescale["params"]["factor"] == 4.0 and lm.max_length == 1000


def test_explicit_max_length_and_no_method(tiny_dir):
    assert make_lm(tiny_dir, method="yarn", factor=4, max_length=1000).max_length == 1000
    plain = make_lm(tiny_dir, method=None, dtype="bfloat16")
    assert plain.max_length == TINY_CONTEXT and not getattr(plain.model.config, "ropescale", None)
    assert plain.model.dtype == torch.bfloat16


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"method": "yarn", "factor": 4, "bogus": 1}, "unknown model_args for 'ropescale': bogus"),
        ({"method": "nope", "factor": 4}, "unknown method 'nope'"),
        ({"method": "yarn", "factor": "abc"}, "factor must be a number, got 'abc'"),
        ({"method": "yarn", "factor": 0}, "factor must be > 0"),
        ({"method": "yarn", "factor": 0.5}, "factor must be >= 1"),  # the method's own range check
        ({"method": "yarn", "factor": 4, "param_bogus": 1}, "unknown parameter 'bogus'"),
        ({"method": "yarn", "factor": 4, "max_length": 0}, "max_length must be a positive integer"),
        ({"method": "yarn", "factor": 4, "dtype": "int7"}, "dtype must be one of"),
        ({"method": "yarn", "factor": 4, "sliding_window": "wide"}, "sliding_window must be keep, none or a positive"),
        ({"method": "yarn", "factor": 4, "replace": "maybe"}, "replace must be true or false"),
        ({"method": "yarn", "factor": 4, "truncate_prompts": "2"}, "truncate_prompts must be true or false"),
        ({"factor": 4}, "without a method"),
    ],
)
def test_bad_model_args_are_one_line_errors(tiny_dir, kwargs, message):
    with pytest.raises(ValueError, match=message) as info:
        make_lm(tiny_dir, **kwargs)
    assert "\n" not in str(info.value)


def test_split_model_args_groups_and_lists_what_it_accepts():
    groups = split_model_args({"method": "yarn", "revision": "main", "batch_size": 2, "param_long_factor": "[1,2]"})
    assert groups == {
        "scaling": {"method": "yarn"},
        "load": {"revision": "main"},
        "params": {"long_factor": [1, 2]},
        "hflm": {"batch_size": 2},
    }
    with pytest.raises(ValueError, match=r"unknown model_args for 'ropescale': param_, x \(accepted: pretrained, "):
        split_model_args({"x": 1, "param_": 2})


def test_missing_model_is_a_ropescale_error(tmp_path):
    from ropescale.errors import RopescaleError

    with pytest.raises(RopescaleError, match="not found"):
        lm_eval.api.registry.get_model("ropescale")(pretrained=str(tmp_path / "nothing"), method="yarn", factor=4)


def test_target_length_instead_of_factor(tiny_dir):
    lm = make_lm(tiny_dir, method="yarn", target_length=4 * TINY_CONTEXT)
    assert lm.model.config.ropescale["params"]["factor"] == 4.0 and lm.max_length == 4 * TINY_CONTEXT


def test_ready_patched_model_and_tokenizer(tiny_dir):
    import ropescale

    model = ropescale.from_pretrained(str(tiny_dir), method="linear", factor=2)
    cls = lm_eval.api.registry.get_model("ropescale")
    lm = cls(pretrained=model, tokenizer=str(tiny_dir))
    assert lm.model is model and lm.max_length == 2 * TINY_CONTEXT
    with pytest.raises(ValueError, match="used as it is"):
        cls(pretrained=model, tokenizer=str(tiny_dir), method="yarn", factor=4)
    with pytest.raises(ValueError, match="needs its tokenizer"):
        cls(pretrained=model)
    with pytest.raises(ValueError, match="used as it is"):
        integration.run_harness(lm, "passkey_2k", method="yarn")


def test_a_patched_folder_runs_as_saved_and_none_removes_its_scaling(tiny_dir, tmp_path):
    """Issue 39: the lm-eval model of a checkpoint written by `ropescale patch` runs its saved scaling unless
    a method is named; `method=none` is the unscaled baseline and says so; what ran is read back."""
    from ropescale.cli.main import main

    scaled = tmp_path / "y4"
    assert main(["patch", "--model", str(tiny_dir), "--factor", "4", "--output", str(scaled)]) == 0
    saved = make_lm(scaled)
    assert saved.scaling["method"] == "yarn" and saved.scaling["factor"] == 4.0 and saved.scaling["as"] == "saved"
    assert saved.scaling["attention_factor"] == pytest.approx(0.1 * __import__("math").log(4) + 1)
    asked = make_lm(tiny_dir, method="yarn", factor=4)
    removed = make_lm(scaled, method="none")
    assert removed.scaling["method"] == "default" and removed.scaling["as"] == "scaling removed"
    assert make_lm(scaled, method="linear", factor=4).scaling["as"] == "replaces saved yarn x4"
    ids = torch.arange(4, 40).unsqueeze(0)
    with torch.no_grad():
        logits = {k: lm.model(ids).logits for k, lm in (("saved", saved), ("asked", asked), ("removed", removed))}
        plain = make_lm(tiny_dir).model(ids).logits
    assert torch.allclose(logits["saved"], logits["asked"], atol=1e-7)
    assert torch.allclose(logits["removed"], plain, atol=1e-7)
    assert (logits["saved"] - plain).abs().max() > 1e-5  # the test can fail
