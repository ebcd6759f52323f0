"""A config.json that says its RoPE twice and disagrees (``rope_parameters`` vs ``rope_scaling``, the
dict vs the top-level ``rope_theta`` / ``partial_rotary_factor`` / ``original_max_position_embeddings``)
is refused in one line naming both keys and values, before weights load, by every command; doctor
and loading agree. Keys that agree (every checkpoint ropescale writes) pass."""

from __future__ import annotations

import json

import pytest

import ropescale
from tests.conftest import tiny_model
from tests.models.test_config_check import _cli, _variant, no_weights, saved  # noqa: F401 - fixtures

YARN = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0, "original_max_position_embeddings": 64}
LINEAR = {"rope_type": "linear", "factor": 2.0}

CASES = {
    "yarn x4 vs linear x2": (
        lambda d: d.update(rope_parameters=dict(YARN), rope_scaling=dict(LINEAR)),
        "rope_parameters.rope_type = 'yarn' but rope_scaling.rope_type = 'linear': transformers 5",
    ),
    "same type, other factor": (
        lambda d: d.update(rope_parameters=dict(YARN), rope_scaling={**YARN, "factor": 2.0}),
        "rope_parameters.factor = 4.0 but rope_scaling.factor = 2.0",
    ),
    "theta in the dict vs top level": (
        lambda d: d.update(rope_theta=500000.0),
        "rope_parameters.rope_theta = 10000.0 but rope_theta = 500000.0: transformers 4",
    ),
    "theta absent from rope_scaling": (
        lambda d: d.update(
            rope_parameters={**YARN, "rope_theta": 5e5},
            rope_scaling={k: v for k, v in YARN.items() if k != "rope_theta"},
        ),
        "rope_parameters.rope_theta = 500000.0 but rope_scaling.rope_theta (absent, so transformers' default) = 10000.0",
    ),
    "partial_rotary_factor in the dict vs top level": (
        lambda d: (d["rope_parameters"].update(partial_rotary_factor=0.5), d.update(partial_rotary_factor=1.0)),
        "rope_parameters.partial_rotary_factor = 0.5 but partial_rotary_factor = 1.0",
    ),
    "original context in the dict vs top level": (
        lambda d: d.update(rope_parameters=dict(YARN), original_max_position_embeddings=32),
        "rope_parameters.original_max_position_embeddings = 64 but original_max_position_embeddings = 32: "
        "transformers 5, vLLM and SGLang take the top-level one",
    ),
    "type vs rope_type in one dict": (
        lambda d: (d.pop("rope_parameters"), d.update(rope_theta=1e4, rope_scaling={**LINEAR, "type": "dynamic"})),
        "rope_scaling.rope_type = 'linear' but rope_scaling.type = 'dynamic': transformers reads rope_type",
    ),
    "extended context below the trained one": (
        lambda d: d.update(rope_parameters={**YARN, "original_max_position_embeddings": 128}),
        "max_position_embeddings = 64 is below rope_parameters.original_max_position_embeddings = 128",
    ),
}

COMMANDS = {
    "doctor": lambda m, out: ["doctor", m],
    "patch --output": lambda m, out: ["patch", "--model", m, "--factor", "4", "--replace", "--output", out],
    "eval": lambda m, out: ["eval", "perplexity", "--model", m, "--lengths", "32", "--output", out],
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("command", COMMANDS)
def test_disagreeing_keys_are_one_line_before_weights(saved, tmp_path, capsys, no_weights, case, command):  # noqa: F811
    edit, fragment = CASES[case]
    model = _variant(saved, tmp_path, edit)
    out = tmp_path / "out"
    code, err = _cli(capsys, *COMMANDS[command](str(model), str(out)))
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith(f"ropescale: error: {model}/config.json: "), err
    assert fragment in err[0], err
    assert not out.exists()


def test_load_config_refuses_what_it_would_silently_read_as_rope_scaling(saved, tmp_path):  # noqa: F811
    """Before: transformers 5 loaded rope_scaling (linear x2) while doctor reported rope_parameters (yarn x4)."""
    from ropescale.models.config_check import ConfigError
    from ropescale.models.loading import load_config

    model = _variant(saved, tmp_path, CASES["yarn x4 vs linear x2"][0])
    with pytest.raises(ConfigError, match="rope_scaling.rope_type = 'linear'"):
        load_config(model)


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3"])
@pytest.mark.parametrize("method", ["yarn", "llama3", "linear"])
def test_agreeing_keys_pass(tmp_path, capsys, arch, method):
    """ropescale writes rope_scaling and the top-level keys from rope_parameters: they agree."""
    path = tmp_path / "m"
    model = tiny_model(arch, rope_parameters={"rope_type": "default", "rope_theta": 5e5})
    ropescale.save_pretrained(ropescale.patch(model, method, factor=4), path, config_only=True)
    data = json.loads((path / "config.json").read_text())
    assert data["rope_scaling"]["rope_type"] == method and data["rope_theta"] == 5e5
    from ropescale.models.config_check import check_config_dict

    check_config_dict(data, str(path / "config.json"))
