"""Shared fixtures: tiny random Llama / Mistral / Qwen2 models built from configs (no download)."""

from __future__ import annotations

import copy
import importlib.util
import os
import re
import sys
from pathlib import Path

# Before transformers/huggingface_hub read them: a test that tries the Hub fails fast, never hangs.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# `auto` precision means bf16 on CPUs with AMX/AVX512-BF16 and fp32 elsewhere: the tests pin the fp32
# answer so they mean the same on every CI machine (tests/models/test_runtime_bf16.py checks the other).
os.environ["ROPESCALE_CPU_BF16"] = "0"

import pytest  # noqa: E402
import torch  # noqa: E402

from ropescale.models import tiny  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def load_script(relative: str, name: str | None = None):
    """A script of the repository that is not in the package (a benchmark, an lm-eval task file),
    imported by path as its own tool imports it; registered in ``sys.modules`` so its dataclasses find
    their module."""
    path = REPO / relative
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


ORIGINAL_CONTEXT = 64  # L of the tiny models: inputs of 200 tokens are > 3L


def squeezed(text: str) -> str:
    """Markdown with runs of spaces made one (:func:`ropescale.markdown.table` pads columns to their widest
    cell), so a test can look for ``| name | 1.003 |`` whatever the widths."""
    return re.sub(" +", " ", text)


def tiny_config(arch: str = "llama", **overrides):
    """:func:`ropescale.models.tiny.tiny_config` with the tests' L and eager attention."""
    return tiny.tiny_config(
        arch, **{"max_position_embeddings": ORIGINAL_CONTEXT, "attn_implementation": "eager", **overrides}
    )


def tiny_model(arch: str = "llama", seed: int = 0, state_dict=None, **overrides):
    """A tiny random model in eval mode (:func:`tiny_config`); pass ``state_dict`` to share weights with another."""
    defaults = {"max_position_embeddings": ORIGINAL_CONTEXT, "attn_implementation": "eager"}
    model = tiny.tiny_model(arch, seed=seed, **{**defaults, **overrides})
    if state_dict is not None:
        model.load_state_dict(copy.deepcopy(state_dict))
    return model


@pytest.fixture
def long_input():
    torch.manual_seed(1)
    return torch.randint(0, 128, (2, 200))  # [b, s] with s > 3L


@pytest.fixture(scope="session")
def session_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("ropescale-cache")


@pytest.fixture(autouse=True)
def _isolated_cache(session_cache, monkeypatch):
    """Tests never read or write the user's ~/.cache/ropescale (the embedded model converts once
    per test session into a temporary cache)."""
    monkeypatch.setenv("ROPESCALE_CACHE", str(session_cache))


# The experiment drivers in benchmarks/ (extension_plan.py, extension_goal.py, ...) import each other by file
# name, as they do when run as scripts; the tests import them the same way.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
