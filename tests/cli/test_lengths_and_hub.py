"""Lengths as the docs write them (``4k,32k``: 1k = 1024) in every length-like flag and suite file,
through one parser (:func:`ropescale.options.length`); and a Hub id that cannot be fetched offline
said in one line with what to do (a local folder). Before: ``--lengths 4k,32k`` was a usage error,
and a Hub id gave transformers' "couldn't connect" with no hint."""

from __future__ import annotations

import pytest

from ropescale import options
from ropescale.cli.main import build_parser
from ropescale.evals.suite.parse import SuiteError, suite_from_dict
from tests.cli.test_patch_cli import assert_one_line_error, run


@pytest.mark.parametrize(
    "text,expected", [("4k", 4096), ("32K", 32768), (" 128k ", 131072), ("1.5k", 1536), ("4096", 4096), (8192, 8192)]
)
def test_length_reads_k_as_1024(text, expected):
    assert options.length(text) == expected


@pytest.mark.parametrize("text", ["k", "0k", "-4k", "1.0001k", "4m", "abc", "0", True])
def test_length_refuses(text):
    with pytest.raises(ValueError, match="positive integer or a number of k"):
        options.length(text, "--lengths")


def test_lengths_lists():
    assert options.lengths("4k,32k") == [4096, 32768]
    assert options.lengths([2048, "8k"]) == [2048, 8192]
    with pytest.raises(ValueError, match="--lengths must be comma-separated lengths"):
        options.lengths("4k,x", "--lengths")


@pytest.mark.parametrize(
    "argv,field,expected",
    [
        (["eval", "perplexity", "--lengths", "4k,32k"], "lengths", [4096, 32768]),
        (["eval", "perplexity", "--lengths", "2k", "--max-tokens", "8k"], "max_tokens", 8192),
        (["eval", "perplexity", "--lengths", "2k", "--stride", "1k"], "stride", 1024),
        (["eval", "passkey", "--lengths", "4k,16k"], "lengths", [4096, 16384]),
        (["eval", "needle", "--lengths", "8k"], "lengths", [8192]),
        (["eval", "perplexity", "--lengths", "2k", "--target-length", "32k"], "target_length", 32768),
        (["patch", "--target-length", "32k"], "target_length", 32768),
        (
            ["patch", "--factor", "4", "--original-max-position-embeddings", "8k"],
            "original_max_position_embeddings",
            8192,
        ),
        (["recommend", "--target-length", "16k"], "target_length", 16384),
        (["eval", "frontier", "--target-length", "16k", "--max-tokens", "4k"], "max_tokens", 4096),
        (
            ["search", "--output", "o", "--target-length", "16k", "--report-lengths", "16k,32k"],
            "report_lengths",
            (16384, 32768),
        ),
        (["search", "--output", "o", "--target-length", "16k", "--eval-length", "4k"], "eval_length", 4096),
    ],
)
def test_every_length_flag_takes_k(argv, field, expected):
    args = build_parser().parse_args(argv)
    got = getattr(args, field)
    if field == "report_lengths":
        from ropescale.search.options import lengths

        got = lengths(got)
    assert got == expected


def test_a_bad_length_flag_is_one_line(capsys):
    code, _, err = run(capsys, "eval", "perplexity", "--lengths", "4q")
    assert code == 2
    assert_one_line_error(code, err, "--lengths must be comma-separated lengths (positive integers, or 4k = 4096)")


@pytest.mark.parametrize("text", ["128,64,64", "4k,4096"])
def test_a_length_given_twice_is_one_line(capsys, text):
    """One cell per length: ``--lengths 128,64,64`` measured 64 once and reported the column twice."""
    code, _, err = run(capsys, "eval", "perplexity", "--lengths", text)
    twice = 64 if text.startswith("128") else 4096
    assert_one_line_error(code, err, f"--lengths gives {twice} twice ('{text}'); give each length once")
    assert code == 2
    code, _, err = run(capsys, "search", "--output", "o", "--target-length", "16k", "--report-lengths", text)
    assert_one_line_error(code, err, f"--report-lengths gives {twice} twice ('{text}'); give each length once")
    with pytest.raises(SuiteError, match=f"^perplexity.lengths gives {twice} twice; give each length once$"):
        suite_from_dict({"model": "m", "methods": [{"method": "none"}], "perplexity": {"lengths": text.split(",")}})


def test_suite_lengths_take_k(tmp_path):
    raw = {
        "model": "m",
        "methods": [{"method": "yarn", "factor": 4, "only": {"passkey": ["4k"]}}],
        "perplexity": {"lengths": ["2k", 8192], "max_tokens": "16k", "stride": "1k"},
        "passkey": {"lengths": ["4k", "16K"]},
    }
    suite = suite_from_dict(raw)
    assert suite.perplexity["lengths"] == [2048, 8192] and suite.perplexity["max_tokens"] == 16384
    assert suite.perplexity["stride"] == 1024
    assert suite.passkey["lengths"] == [4096, 16384] and suite.methods[0].only == {"passkey": [4096]}
    with pytest.raises(SuiteError, match=r"passkey.lengths must be positive integers, got '4q'"):
        suite_from_dict({**raw, "passkey": {"lengths": ["4q"]}})


@pytest.mark.parametrize(
    "argv",
    [
        ["patch", "--model", "org/name", "--factor", "4"],
        ["doctor", "org/name"],
        ["eval", "perplexity", "--model", "org/name", "--lengths", "4k", "--method", "yarn", "--factor", "2"],
    ],
)
def test_unreachable_hub_says_to_use_a_local_folder(capsys, monkeypatch, tmp_path, argv):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert_one_line_error(
        code,
        err,
        "'org/name' is a Hugging Face Hub id, and the Hub is unreachable here",
        "point --model at a local folder",
    )
