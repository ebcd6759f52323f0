"""Attention-level methods on a checkpoint its maker already extended (Llama 3.1's llama3 RoPE, a
YaRN Qwen): ropescale's kernels rotate with plain RoPE from the original context, dropping the
frequencies the model was trained with, where the references keep them (STRING also takes its shift
from max_position_embeddings). Before: run silently (with --replace) on plain RoPE and shift 0.33 x L.
Now: one line naming the rope type, both contexts and what the reference does, before weights."""

from __future__ import annotations

import pytest

import ropescale
from tests.cli.test_patch_cli import assert_one_line_error, run
from tests.conftest import tiny_config, tiny_model
from tests.models.test_config_check import no_weights  # noqa: F401 - fixture

LLAMA31 = {
    "rope_type": "llama3",
    "rope_theta": 5e5,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
YARN = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 64}
ATTENTION_METHODS = ["string", "self_extend", "dca", "self_extend_llamacpp"]


@pytest.mark.parametrize("method", ATTENTION_METHODS)
@pytest.mark.parametrize("arch,rope,extended", [("llama", LLAMA31, 1024), ("qwen2", YARN, 256), ("qwen3", YARN, 256)])
@pytest.mark.parametrize("replace", [True, False])
def test_attention_method_on_an_extended_checkpoint_is_refused(arch, rope, extended, method, replace):
    config = tiny_config(arch, rope_parameters=dict(rope), max_position_embeddings=extended)
    with pytest.raises(ropescale.errors.RopescaleError) as info:
        ropescale.patch_config(config, method, factor=2, replace=replace)
    line = str(info.value)
    assert line.startswith(f"{method} on an already extended model (rope_parameters.rope_type = '{rope['rope_type']}'")
    assert f"max_position_embeddings = {extended}, trained at 64" in line
    assert f"dropping the {rope['rope_type']} frequencies" in line and "give --model the base model" in line


def test_string_names_the_readme_shift():
    config = tiny_config("llama", rope_parameters=dict(LLAMA31), max_position_embeddings=1024)
    with pytest.raises(ropescale.errors.RopescaleError, match=r"HKUNLP/STRING\) keep them and take shift = .* = 337"):
        ropescale.patch_config(config, "string", factor=2, replace=True)


@pytest.mark.usefixtures("no_weights")
def test_cli_refuses_before_weights(tmp_path, capsys):
    path = tmp_path / "llama31"
    tiny_model(rope_parameters=dict(LLAMA31), max_position_embeddings=1024).save_pretrained(path)
    code, _, err = run(capsys, "patch", "--model", str(path), "--method", "string", "--factor", "2", "--replace")
    assert code == 2
    assert_one_line_error(
        code, err, "string on an already extended model", "shift = int(0.33 x max_position_embeddings)"
    )


@pytest.mark.parametrize("method", ATTENTION_METHODS)
def test_a_checkpoint_ropescale_scaled_is_repatched_from_its_recorded_original(method):
    """ropescale's own scaled checkpoints record their true original geometry: re-patching is allowed."""
    config = ropescale.patch_config(tiny_config("llama"), "yarn", factor=4)
    new = ropescale.patch_config(config, method, factor=1.25, replace=True)
    assert new.ropescale["method"] == method and new.ropescale["original_max_position_embeddings"] == 64


@pytest.mark.parametrize("method", ["yarn", "linear", "llama3"])
def test_frequency_methods_still_replace(method):
    config = tiny_config("llama", rope_parameters=dict(LLAMA31), max_position_embeddings=1024)
    assert ropescale.patch_config(config, method, factor=4, replace=True).ropescale["method"] == method
