"""A checkpoint saved by ropescale gives the same logits in plain transformers 4.57 and 5.

``benchmarks/loader_parity.py`` saves tiny Llama and Mistral models (L = 64, Mistral with base
50000) scaled by each native method and loads them with plain ``AutoModelForCausalLM`` under this
environment's transformers 5 and, in one subprocess, under transformers 4.57 from ``make tf4``
(``ROPESCALE_TF4`` or ``.tf4``); 200 tokens, fp32. Without that dir the test fails under CI and
skips elsewhere.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import load_script

ROOT = Path(__file__).resolve().parents[2]
TF4 = Path(os.environ.get("ROPESCALE_TF4") or ROOT / ".tf4")
TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    if not (TF4 / "transformers").is_dir():
        reason = f"no transformers 4.57 in {TF4}: run `make tf4` (make test does)"
        if os.environ.get("CI", "").lower() in ("true", "1"):
            pytest.fail(reason)
        pytest.skip(reason)
    bench = load_script("benchmarks/loader_parity.py")  # registered: its dataclasses look their module up
    return bench.measure(tmp_path_factory.mktemp("parity"), TF4)


def test_transformers_4_57_and_5_give_ropescales_logits(rows):
    names = {r["checkpoint"] for r in rows}
    for arch in ("llama", "mistral"):
        for method in ("linear", "ntk", "dynamic_ntk", "yarn", "llama3", "longrope", "yarn_on_llama3"):
            assert f"{arch}-{method}" in names
    for r in rows:
        assert r["tf4_version"].startswith("4.57."), r
        assert r["tf5_version"].startswith("5."), r
        assert r["tf4"] is not None and r["tf4"] < TOLERANCE, r
        assert r["tf5"] is not None and r["tf5"] < TOLERANCE, r
        assert r["ropescale"] < TOLERANCE, r
        # the scaling matters at this length: a loader that dropped it would be far off
        assert r["unscaled"] > 100 * TOLERANCE, r


def test_transformers_4_57_builds_the_methods_own_rotary(rows):
    expected = {
        "linear": "linear",
        "ntk": "default",
        "dynamic_ntk": "dynamic",
        "yarn": "yarn",
        "llama3": "llama3",
        "longrope": "longrope",
        "yarn_on_llama3": "longrope",  # a composition is saved as LongRoPE with equal factors
    }
    for r in rows:
        method = r["checkpoint"].split("-", 1)[1]
        assert r["tf4_read"]["rope_type"] == expected[method], r
