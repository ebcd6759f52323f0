"""A checkpoint is written (and a model loaded) only if transformers can run its config: ropescale
builds the model from the config on the meta device and runs a few tokens through it first, and
names the key of the classes it knows (partial_rotary_factor on a whole-head model, sliding layers
without a width). Before: ``patch`` printed "wrote" for both, and the first forward pass failed."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

import ropescale
from ropescale.cli.main import main
from ropescale.errors import RopescaleError
from tests.conftest import tiny_model
from tests.models.test_config_check import no_weights  # noqa: F401 - fixture


def _save(path, arch="llama", **overrides):
    tiny_model(arch, **overrides).save_pretrained(path)
    return path


def _cli(capsys, *argv):
    capsys.readouterr()
    code = main([str(a) for a in argv])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip() and "%|" not in line]
    return code, err


def _runs(path):
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    return model(torch.zeros(1, 40, dtype=torch.long)).logits.shape == (1, 40, 128)


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3"])
@pytest.mark.parametrize("method", ["yarn", "dynamic_yarn"])
@pytest.mark.usefixtures("no_weights")
def test_partial_rotary_on_a_whole_head_model_is_refused_before_weights(tmp_path, capsys, arch, method):
    rope = {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}
    model = _save(tmp_path / "m", arch, rope_parameters=rope)
    out = tmp_path / "out"
    code, err = _cli(capsys, "patch", "--model", model, "--method", method, "--factor", "4", "--output", out)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"ropescale: error: {model}/config.json: rope_parameters.partial_rotary_factor = 0.5: ")
    assert "rotates the whole head (16 dims" in err[0] and "remove partial_rotary_factor" in err[0]
    assert not out.exists()


@pytest.mark.parametrize("task", ["perplexity", "passkey"])
@pytest.mark.usefixtures("no_weights")
def test_partial_rotary_is_refused_by_eval_before_weights(tmp_path, capsys, task):
    """eval patches the loaded model in place (past from_pretrained's check): its suite check refuses it
    now, as patch does (before: the weights loaded and the first batch raised a shape RuntimeError)."""
    rope = {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}
    model = _save(tmp_path / "m", rope_parameters=rope)
    out = tmp_path / "out"
    argv = ["eval", task, "--model", model, "--method", "yarn", "--factor", "2", "--lengths", "64", "--output", out]
    code, err = _cli(capsys, *argv)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(
        f"ropescale: error: methods[0] ('yarn'): {model}/config.json: rope_parameters.partial_rotary_factor = 0.5: "
    )
    assert "remove partial_rotary_factor" in err[0] and not out.exists()


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_no_sliding_window_makes_sliding_layers_full(tmp_path, capsys, arch):
    """--sliding-window none on a Qwen with sliding layers: layer_types all full_attention (before:
    sliding_window null with sliding layers, a TypeError in the first forward pass)."""
    model = _save(tmp_path / "m", arch, use_sliding_window=True, sliding_window=32, max_window_layers=1)
    out = tmp_path / "out"
    code, err = _cli(
        capsys,
        "patch",
        "--model",
        model,
        "--method",
        "yarn",
        "--factor",
        "4",
        "--sliding-window",
        "none",
        "--output",
        out,
    )
    assert code == 0, err
    data = json.loads((out / "config.json").read_text())
    assert data["sliding_window"] is None and set(data["layer_types"]) == {"full_attention"}
    assert _runs(out)


@pytest.mark.usefixtures("no_weights")
@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_a_width_that_would_be_ignored_is_refused(tmp_path, capsys, arch):
    model = _save(tmp_path / "m", arch, use_sliding_window=False)
    out = tmp_path / "out"
    argv = ["patch", "--model", model, "--method", "yarn", "--factor", "4", "--sliding-window", "128", "--output", out]
    code, err = _cli(capsys, *argv)
    assert code == 2 and len(err) == 1, err
    assert f"use_sliding_window = false: {arch} attends over the whole context" in err[0]
    assert "sliding_window = 128 would be ignored" in err[0]
    assert not out.exists()


def test_save_checks_the_written_config(tmp_path):
    """ropescale.save_pretrained (patch --config-only, train's export) refuses a config no loader can run."""
    model = tiny_model("qwen2", use_sliding_window=True, sliding_window=32, max_window_layers=0)
    model.config.sliding_window = None  # layer_types still sliding: what patch wrote before
    with pytest.raises(RopescaleError, match=r"out/config.json: sliding_window = None but layer_types has 2"):
        ropescale.save_pretrained(model, tmp_path / "out", config_only=True)
    assert not (tmp_path / "out").exists()


def test_an_unnamed_failure_is_still_caught(tmp_path, monkeypatch):
    """The meta forward pass is the backstop: with the named check switched off, the partial rotary
    config still fails there, as transformers' own message, before any weights."""
    from ropescale.models import runnable

    monkeypatch.setattr(runnable, "check_partial_rotary", lambda config, source: None)
    config = tiny_model(
        rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}
    ).config
    patched = ropescale.patch_config(config, "yarn", factor=4)
    with pytest.raises(RopescaleError, match=r"x: transformers cannot run this config \(RuntimeError: .*8"):
        runnable.check_runnable(patched, "x")


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3"])
@pytest.mark.parametrize("method", ["linear", "dynamic_ntk", "yarn", "llama3", "dynamic_yarn", "self_extend", "dca"])
def test_every_method_passes_the_check(arch, method):
    from ropescale.models.runnable import check_runnable

    config = ropescale.patch_config(tiny_model(arch).config, method, factor=4)
    check_runnable(config, "x")
