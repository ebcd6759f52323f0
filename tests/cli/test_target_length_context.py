"""``--target-length`` on ``eval`` and ``eval frontier`` is reached from the context the patch starts from
(issue 51): the pretraining context from the family table where config.json misstates it, the shipped context
for a method composed on the shipped scaling. Before, both read config.json's field: on Qwen3-8B (40,960
stated, pretrained at 32,768) ``--target-length 131072`` ran YaRN x3.2, which reaches 104,857 tokens."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

SHAPES = Path(__file__).resolve().parents[1] / "data" / "shapes"


def _factor(model: str, target: int, *params: str) -> float:
    from ropescale.cli.eval import methods_from_args

    args = argparse.Namespace(
        method="yarn", methods=None, param=list(params), target_length=target, factor=None, model=model
    )
    (entry,) = methods_from_args(args)
    return entry["factor"]


@pytest.mark.parametrize(
    ("shape", "target", "params", "factor"),
    [
        ("qwen3-8b", 131072, (), 4.0),  # from the family table's 32,768, not config.json's 40,960
        ("qwen3-8b-yarn", 131072, (), 4.0),  # the evaluation replaces the switch: from 32,768
        ("llama3.1-8b", 524288, ("compose=true",), 4.0),  # composed on the shipped 131,072
        ("llama3.1-8b", 524288, (), 64.0),  # replaced: from the pretraining 8,192
    ],
)
def test_eval_target_length_is_reached_from_where_the_patch_starts(shape, target, params, factor):
    assert _factor(str(SHAPES / shape), target, *params) == factor


def test_frontier_scales_its_candidates_from_the_pretraining_context_the_patch_uses():
    from ropescale.cli.frontier import _original_context

    assert _original_context(str(SHAPES / "qwen3-8b"), None) == 32768
    assert _original_context(str(SHAPES / "qwen3-8b"), 40960) == 40960  # the flag is the user's word
