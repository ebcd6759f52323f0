"""A bad suite fails in one line before any tokenizer or weights are loaded: wrong types, unknown
keys, unknown methods or parameters, method parameters the model cannot take, bad task settings."""

from __future__ import annotations

import pytest

from ropescale.evals.suite.parse import SuiteError, suite_from_dict
from ropescale.evals.suite.runner import run_suite
from ropescale.models import loading


@pytest.fixture
def nothing_loads(monkeypatch):
    """Loading a tokenizer or weights is a test failure: every check must come first."""

    def forbidden(*args, **kwargs):
        raise AssertionError("a tokenizer or the weights were loaded before the suite was rejected")

    monkeypatch.setattr(loading, "from_pretrained", forbidden)
    monkeypatch.setattr(loading, "load_tokenizer", forbidden)


@pytest.fixture
def base(model_dir, tmp_path):
    data = tmp_path / "text.txt"
    data.write_text("Some words of text. " * 400)
    return {
        "name": "bad",
        "model": str(model_dir),
        "data": str(data),
        "methods": [{"method": "yarn", "factor": 4}],
        "perplexity": {"lengths": [64], "mode": "nonoverlap"},
        "passkey": {"lengths": [128], "depths": [0.5], "trials": 1},
        "needle": {"task": "niah_single", "lengths": [128], "depths": [0.5], "trials": 1},
    }


def _set(d: dict, path: str, value):
    d = {**d}
    keys = path.split(".")
    inner = d
    for key in keys[:-1]:
        inner[key] = dict(inner[key])
        inner = inner[key]
    inner[keys[-1]] = value
    return d


BAD = [
    ("passkey.depths", 0.5, "passkey.depths must be a non-empty list of numbers in [0, 1]"),
    ("passkey.depths", [1.5], "passkey.depths must be a non-empty list of numbers in [0, 1]"),
    ("passkey.trials", "two", "passkey.trials must be a positive integer, got 'two'"),
    ("needle.trials", 0, "needle.trials must be a positive integer, got 0"),
    ("perplexity.mode", "sliding", "perplexity.mode must be one of yarn, longlora, nonoverlap, got 'sliding'"),
    ("perplexity.stride", -5, "perplexity.stride must be a positive integer or null, got -5"),
    ("perplexity.max_tokens", "lots", "perplexity.max_tokens must be a positive integer or null, got 'lots'"),
    ("perplexity.window", 64, "unknown perplexity key 'window'; known: lengths, mode, stride, max_tokens"),
    ("needle.task", "niah_bogus", "needle.task must be one of"),
    ("seed", "abc", "seed must be an integer, got 'abc'"),
    ("methods", "yarn", "methods must be a list"),
    ("methods", [{"method": "yarn", "factor": 4, "params": [1, 2]}], "methods[0].params must be a mapping"),
    ("methods", [{"method": "yarn", "params": {"factor": 2}}], "methods[0].params: give factor as methods[0].factor"),
    ("methods", [{"method": "yarn", "factor": 4, "lable": "x"}], "unknown key 'lable' in methods[0]"),
    ("methods", [{"method": "yarn", "factor": True}], "methods[0].factor must be a number, got True"),
    # needs the model's geometry (rotary dim 16: 8 pairs), checked from its config before the weights
    ("methods", [{"method": "longrope", "factor": 4, "params": {"long_factor": [1, 2]}}], "long_factor must have 8"),
    ("methods", [{"method": "self_extend", "params": {"window": 999}}], "window must be smaller than"),
]


@pytest.mark.parametrize("path, value, message", BAD, ids=[f"{p}={v!r}"[:40] for p, v, _ in BAD])
def test_bad_suite_fails_before_anything_loads(base, nothing_loads, tmp_path, path, value, message):
    with pytest.raises((SuiteError, ValueError)) as info:
        run_suite(suite_from_dict(_set(base, path, value)), tmp_path / "out", progress=False)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_good_suite_reaches_the_loading(base, nothing_loads, tmp_path):
    with pytest.raises(AssertionError, match="were loaded"):
        run_suite(suite_from_dict(base), tmp_path / "out", progress=False)
