"""ropescale.options: the value parsers the command line and the lm-eval model share."""

from __future__ import annotations

import argparse
import math

import pytest

from ropescale import options
from ropescale.cli.common import typed


@pytest.mark.parametrize(("value", "expected"), [("8192", 8192), (" 7 ", 7), (3, 3), (4.0, 4)])
def test_positive_int(value, expected):
    assert options.positive_int(value) == expected


@pytest.mark.parametrize("value", ["0", "-3", "2.5", "abc", "", None, True, 2.5, math.inf])
def test_positive_int_refuses(value):
    with pytest.raises(ValueError, match=r"^max_length must be a positive integer, got "):
        options.positive_int(value, "max_length")
    with pytest.raises(ValueError, match=r"^expected a positive integer, got "):
        options.positive_int(value)


def test_positive_ints():
    assert options.positive_ints("2048, 8192,") == [2048, 8192] and options.positive_ints([1, "2"]) == [1, 2]
    for bad in ("", "2048,abc", "0", ","):
        with pytest.raises(ValueError, match="--lengths must be comma-separated positive integers"):
            options.positive_ints(bad, "--lengths")


@pytest.mark.parametrize(("value", "expected"), [("4", 4.0), (" 2.5 ", 2.5), (8, 8.0), ("1e1", 10.0), (0.5, 0.5)])
def test_factor_is_a_float(value, expected):
    result = options.factor(value)
    assert result == expected and isinstance(result, float)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("abc", "factor must be a number, got 'abc'"),
        (True, "factor must be a number"),
        (None, "factor must be a number"),
        ("nan", "factor must be finite"),
        ("inf", "factor must be finite"),
        ("0", "factor must be > 0"),
        (-2, "factor must be > 0"),
    ],
)
def test_factor_refuses(value, message):
    with pytest.raises(ValueError, match=message):
        options.factor(value)


def test_boolean():
    assert [options.boolean(v) for v in ("true", "YES", "1", 1, True)] == [True] * 5
    assert [options.boolean(v) for v in ("false", "No", "0", "", 0, False)] == [False] * 6
    with pytest.raises(ValueError, match="replace must be true or false, got 'maybe'"):
        options.boolean("maybe", "replace")
    with pytest.raises(ValueError, match="true or false"):
        options.boolean(2)


def test_sliding_window():
    assert options.sliding_window("keep") == "keep" and options.sliding_window(" KEEP ") == "keep"
    assert options.sliding_window("none") is None and options.sliding_window(None) is None
    assert options.sliding_window("4096") == 4096 and options.sliding_window(4096) == 4096
    for bad in ("wide", "0", -1, 2.5):
        with pytest.raises(ValueError, match="sliding_window must be keep, none or a positive integer"):
            options.sliding_window(bad)


def test_param_value_and_key_values():
    assert options.param_value("32") == 32 and options.param_value("[1,2]") == [1, 2]
    assert options.param_value("1.0e+4") == 1e4 and options.param_value("true") is True
    assert options.param_value("a: [") == "a: [" and options.param_value(5) == 5  # unreadable YAML stays text
    assert options.key_values(["beta_fast=32", " long_factor = [1,2]", "beta_fast=16"]) == {
        "beta_fast": 16,
        "long_factor": [1, 2],
    }
    with pytest.raises(ValueError, match="--param expects KEY=VALUE, got 'novalue'"):
        options.key_values(["novalue"])
    with pytest.raises(ValueError, match="--param expects KEY=VALUE"):
        options.key_values(["=3"])
    assert options.key_values(['{"max_seq_lengths": [4096]}', "k=1"], "--metadata", allow_json=True) == {
        "max_seq_lengths": [4096],
        "k": 1,
    }
    with pytest.raises(ValueError, match="--metadata: invalid JSON"):
        options.key_values(["{1"], "--metadata", allow_json=True)
    with pytest.raises(ValueError, match="--metadata expects KEY=VALUE or a JSON object, got '\\[1\\]'"):
        options.key_values(["[1]"], "--metadata", allow_json=True)
    with pytest.raises(ValueError, match="--param expects KEY=VALUE, got '{\"a\": 1}'"):
        options.key_values(['{"a": 1}'])  # JSON only where the flag allows it


def test_none_like():
    assert all(options.none_like(v) for v in (None, "", " None ", "none"))
    assert not any(options.none_like(v) for v in (0, "0", "keep", False))


def test_typed_turns_the_message_into_an_argparse_error(capsys):
    parser = argparse.ArgumentParser(prog="p")
    parser.add_argument("--factor", type=typed(options.factor))
    parser.add_argument("--n", type=typed(options.positive_int, "--n"))
    assert parser.parse_args(["--factor", "4", "--n", "3"]) == argparse.Namespace(factor=4.0, n=3)
    with pytest.raises(SystemExit):
        parser.parse_args(["--factor", "x"])
    assert "argument --factor: factor must be a number, got 'x'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser.parse_args(["--n", "0"])
    assert "argument --n: --n must be a positive integer, got '0'" in capsys.readouterr().err
