"""Released checkpoints whose config.json overstates the pretraining context are scaled from the context
their model cards give (the family table of ropescale.patching.shipped), and the output names that source."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from transformers import AutoConfig

from ropescale.patching.plan import plan_patch

SHAPES = Path(__file__).resolve().parents[1] / "data" / "shapes"


@pytest.mark.parametrize(
    "shape, trained, family",
    [
        ("qwen3-8b", 32768, "Qwen3"),
        ("qwen2.5-7b", 32768, "Qwen2/Qwen2.5"),
        ("mistral-7b-v0.1", 8192, "Mistral-7B-v0.1"),
    ],
)
def test_scaling_from_an_overstated_context_uses_the_family_table(shape, trained, family):
    config = AutoConfig.from_pretrained(SHAPES / shape)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to warn: the family table gives the context, named
        plan = plan_patch(config, "yarn", target_length=4 * trained)
    assert plan.method.factor == 4 and plan.spec.original_max_position_embeddings == trained
    assert plan.start == f"from the pretraining context {trained} (family table: {family})"
    given = plan_patch(config, "yarn", original_max_position_embeddings=trained // 2, target_length=4 * trained)
    assert given.method.factor == 8 and "(--original-max-position-embeddings)" in given.start  # the user's word wins


@pytest.mark.parametrize("shape", ["llama3-8b", "mistral-7b-v0.3"])
def test_families_whose_config_says_the_trained_context_are_not_warned(shape):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan = plan_patch(AutoConfig.from_pretrained(SHAPES / shape), "yarn", factor=4)
    assert plan.start.endswith("(config.json max_position_embeddings)")


def test_the_cli_says_which_context_and_where_it_came_from():
    """In a real process: no warning, and the summary names the context and its source."""
    argv = ["patch", "--model", str(SHAPES / "qwen3-8b"), "--method", "yarn", "--target-length", "128k"]
    code = f"from ropescale.cli.main import main; raise SystemExit(main({argv!r}))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert not [line for line in done.stderr.splitlines() if line.strip()], done.stderr
    assert "context:            32768 -> 131072 tokens" in done.stdout
    assert "starts:             from the pretraining context 32768 (family table: Qwen3)" in done.stdout


def test_recommend_scales_from_the_family_context(capsys):
    """Without --original-max-position-embeddings the printed patch command reaches x4 from 32,768 (before the
    family table it scaled from the 131,072 config.json states and changed nothing)."""
    from ropescale.cli.main import main

    argv = ["recommend", "--model", str(SHAPES / "qwen2.5-7b"), "--target-length", "128k"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "32,768 → 131,072 tokens, ×4" in out
