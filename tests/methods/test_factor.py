"""``target_length`` → factor: exact N / L for continuous methods, whole numbers for llama3, clear errors."""

from __future__ import annotations

import math

import pytest

import ropescale
from ropescale.methods import METHODS, RotarySpec, get_method
from ropescale.methods.factor import INTEGER_FACTOR_METHODS, factor_for_target, resolve_factor
from tests.conftest import ORIGINAL_CONTEXT, tiny_config

SCALING = sorted(
    set(METHODS) - {"default", "longrope", "composed"}
)  # longrope needs its factor lists, composed its base


@pytest.mark.parametrize("method", SCALING)
@pytest.mark.parametrize("target, L", [(32768, 8192), (10000, 4096), (100000, 8192), (5000, 4000)])
def test_factor_reaches_the_target(method, target, L):
    factor = factor_for_target(method, target, L)
    spec = RotarySpec(head_dim=64, base=1e4, original_max_position_embeddings=L)
    extended = get_method(method, factor=factor).extended_context(spec)
    if method in INTEGER_FACTOR_METHODS:
        assert factor == math.ceil(target / L) and factor.is_integer()
        assert extended >= target
    else:
        assert factor == target / L  # exact: the extended context is the target itself
        assert extended == target


def test_llama3_rounds_up_and_keeps_whole_ratios():
    assert factor_for_target("llama3", 10000, 4096) == 3.0
    assert factor_for_target("llama3", 32768, 8192) == 4.0
    assert factor_for_target("llama3", 8193, 8192) == 2.0


def test_aliases_and_instances_and_longrope():
    assert factor_for_target("pi", 16384, 8192) == 2.0
    assert factor_for_target(get_method("llama3", factor=8), 20000, 8192) == 3.0
    assert factor_for_target("longrope", 12288, 8192) == 1.5


@pytest.mark.parametrize("target", [8192, 4096, 1])
def test_target_not_beyond_the_trained_context_is_refused(target):
    with pytest.raises(ValueError, match=f"target length {target} is not beyond the model's trained context 8192"):
        factor_for_target("yarn", target, 8192)


@pytest.mark.parametrize(
    "method, target, message",
    [
        ("default", 16384, "does not scale"),
        ("none", 16384, "does not scale"),
        ("yarm", 16384, "did you mean 'yarn'"),
        ("yarn", 16384.0, "target_length must be a positive integer"),
        ("yarn", 0, "target_length must be a positive integer"),
        ("yarn", True, "target_length must be a positive integer"),
    ],
)
def test_bad_input(method, target, message):
    with pytest.raises(ValueError, match=message):
        factor_for_target(method, target, 8192)


def test_resolve_factor():
    assert resolve_factor("yarn", "4") == "4"  # passed through, the method class validates it
    assert resolve_factor("yarn", None) is None
    assert resolve_factor("yarn", None, 16384, 8192) == 2.0
    with pytest.raises(ValueError, match="not both"):
        resolve_factor("yarn", 2, 16384, 8192)
    with pytest.raises(ValueError, match="original context"):
        resolve_factor("yarn", None, 16384)


@pytest.mark.parametrize(
    "method, target, factor, max_positions",
    [("yarn", 256, 4.0, 256), ("linear", 160, 2.5, 160), ("llama3", 200, 4.0, 256), ("dynamic_ntk", 256, 4.0, 64)],
)
def test_patch_config_with_target_length(method, target, factor, max_positions):
    config = ropescale.patch_config(tiny_config(), method, target_length=target)
    assert config.ropescale["params"]["factor"] == factor
    assert config.max_position_embeddings == max_positions  # dynamic methods keep L
    direct = ropescale.patch_config(tiny_config(), method, factor=factor)
    assert config.rope_parameters == direct.rope_parameters


def test_target_length_uses_the_original_context_of_a_scaled_model():
    scaled = ropescale.patch_config(tiny_config(), "linear", factor=2)
    again = ropescale.patch_config(scaled, "yarn", target_length=8 * ORIGINAL_CONTEXT, replace=True)
    assert again.ropescale["params"]["factor"] == 8.0
    with pytest.raises(ValueError, match="not both"):
        ropescale.patch_config(tiny_config(), "yarn", factor=4, target_length=256)
    with pytest.raises(ValueError, match="not beyond"):
        ropescale.patch_config(tiny_config(), "yarn", target_length=ORIGINAL_CONTEXT)


def test_patch_model_and_from_pretrained_accept_target_length(tmp_path):
    from tests.conftest import tiny_model

    model = ropescale.patch(tiny_model(), "yarn", target_length=256)
    assert model.config.rope_parameters["factor"] == 4.0
    tiny_model().save_pretrained(tmp_path / "tiny")
    loaded = ropescale.from_pretrained(str(tmp_path / "tiny"), method="llama3", target_length=200)
    assert loaded.config.rope_parameters["factor"] == 4.0 and loaded.config.max_position_embeddings == 256
    with pytest.raises(ValueError, match="without a method"):
        ropescale.from_pretrained(str(tmp_path / "tiny"), target_length=256)
