"""Released checkpoints whose config.json overstates the trained context are named when scaled from it."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from transformers import AutoConfig

from ropescale.patching.plan import plan_patch

SHAPES = Path(__file__).resolve().parents[1] / "data" / "shapes"


@pytest.mark.parametrize("shape, trained", [("qwen3-8b", 32768), ("qwen2.5-7b", 32768), ("mistral-7b-v0.1", 8192)])
def test_scaling_from_an_overstated_context_says_which_to_pass(shape, trained):
    config = AutoConfig.from_pretrained(SHAPES / shape)
    with pytest.warns(UserWarning, match=f"--original-max-position-embeddings {trained}"):
        plan_patch(config, "yarn", factor=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # given the trained context: nothing to say, and x4 from it
        plan = plan_patch(config, "yarn", original_max_position_embeddings=trained, target_length=4 * trained)
    assert plan.method.factor == 4


@pytest.mark.parametrize("shape", ["llama3-8b", "mistral-7b-v0.3"])
def test_families_whose_config_says_the_trained_context_are_not_warned(shape):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan_patch(AutoConfig.from_pretrained(SHAPES / shape), "yarn", factor=4)


def test_the_cli_says_it_in_one_line():
    """Outside pytest's warning capture (a real process), the warning is one ``ropescale: warning:`` line."""
    argv = ["patch", "--model", str(SHAPES / "qwen3-8b"), "--method", "yarn", "--target-length", "128k"]
    code = f"from ropescale.cli.main import main; raise SystemExit(main({argv!r}))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("ropescale: warning: config.json says max_position_embeddings = 40960")


def test_recommend_carries_the_trained_context_into_its_commands(capsys):
    """Given --original-max-position-embeddings, the printed patch command reaches the same x4 (without it,
    the command would scale from the 131072 config.json states and change nothing)."""
    from ropescale.cli.main import main

    argv = ["recommend", "--model", str(SHAPES / "qwen2.5-7b"), "--target-length", "128k"]
    assert main([*argv, "--original-max-position-embeddings", "32k"]) == 0
    out = capsys.readouterr().out
    assert "32,768 → 131,072 tokens, ×4" in out
    patch = next(line.strip() for line in out.splitlines() if line.strip().startswith("ropescale patch"))
    assert patch.split("--output")[0].endswith("--original-max-position-embeddings 32768 ")
