"""benchmarks/shipped_ppl_table.py: the paired ratio of two rows' perplexities on the same windows."""

from __future__ import annotations

import math

import pytest

from tests.conftest import load_script


def _result(nlls, tokens):
    return {"window_nll": nlls, "window_tokens": tokens, "total_nll": sum(nlls), "tokens_scored": sum(tokens)}


def test_the_ratio_is_the_perplexities_and_its_interval_the_windows_spread():
    table = load_script("benchmarks/shipped_ppl_table.py")
    a = _result([110.0, 120.0, 130.0], [100, 100, 100])
    b = _result([100.0, 100.0, 100.0], [100, 100, 100])
    ratio, low, high, n = table.paired_ratio(a, b)
    assert n == 3 and ratio == pytest.approx(math.exp(60.0 / 300))  # PPL(a) / PPL(b) on the same tokens
    assert low < ratio < high and low == pytest.approx(math.exp(0.2 - 4.302653 * 0.1 / math.sqrt(3)), rel=1e-6)
    with pytest.raises(SystemExit, match="did not score the same windows"):
        table.paired_ratio(a, _result([1.0, 1.0], [100, 100]))


def test_first_keeps_the_leading_windows_of_the_first_document():
    """``--first N``: the windows within the first N tokens (a suite's first document), their perplexity."""
    table = load_script("benchmarks/shipped_ppl_table.py")
    r = {**_result([200.0, 100.0, 300.0], [100, 100, 50]), "ppl": 0.0}
    head = table.leading(r, 200)
    assert head["window_nll"] == [200.0, 100.0] and head["tokens_scored"] == 200
    assert head["ppl"] == pytest.approx(math.exp(1.5)) and table.leading(r, None) is r
