"""``ropescale eval harness`` and ``ropescale-lm-eval`` on the tiny lm-eval checkpoint (offline)."""

from __future__ import annotations

import argparse
import json
import sys

import pytest

from ropescale.cli import lm_eval as lm_eval_cmd
from ropescale.evals.lm_eval import TASKS_DIR, runner
from tests.evals.lm_eval.conftest import no_defaults_task_manager, no_env_report, tiny_dir  # noqa: F401 (fixtures)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    lm_eval_cmd.COMMAND.install(parser.add_subparsers())
    return parser


def test_cli_command(tiny_dir, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "res.json"
    args = _parser().parse_args(
        [
            "harness",
            "--model",
            str(tiny_dir),
            "--method",
            "dynamic",
            "--factor",
            "4",
            "--tasks",
            "passkey_2k",
            "--limit",
            "1",
            "--device",
            "cpu",
            "--metadata",
            "passkey_samples=3",
            "--output",
            str(out),
        ]
    )
    assert args.factor == 4.0 and isinstance(args.factor, float)  # typed at the boundary
    assert args.func(args) == 0
    printed = capsys.readouterr().out
    assert "passkey_2k" in printed and "|acc" in printed and f"wrote {out}" in printed
    data = json.loads(out.read_text())
    assert data["ropescale"]["method"] == "dynamic_ntk" and data["n-samples"]["passkey_2k"]["original"] == 3


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--method", "none", "--factor", "4", "--tasks", "passkey_2k"], "--method none"),
        (["--method", "yarn", "--tasks", "passkey_2k"], "--method yarn needs --factor"),
        (["--factor", "4", "--tasks", "passkey_2k"], "need a --method"),
        (["--method", "yarn", "--factor", "4", "--tasks", "no_such_task"], "unknown task"),
        (["--method", "yarn", "--factor", "4", "--tasks", "passkey_2k", "--limit", "0"], "limit must be a positive"),
        (["--method", "yarn", "--factor", "4", "--tasks", ","], "no tasks given"),
        (["--method", "yarn", "--factor", "4", "--tasks", "passkey_2k", "--metadata", "oops"], "--metadata expects"),
        (
            ["--method", "yarn", "--factor", "4", "--tasks", "passkey_2k", "--metadata", "{1"],
            "--metadata: invalid JSON",
        ),
    ],
)
def test_cli_bad_arguments_fail_before_loading(tiny_dir, argv, message, monkeypatch):  # noqa: F811
    monkeypatch.setattr(runner, "task_manager", no_defaults_task_manager(runner))
    args = _parser().parse_args(["harness", "--model", str(tiny_dir), *argv])
    with pytest.raises(ValueError, match=message):
        args.func(args)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--factor", "abc"], "argument --factor: factor must be a number, got 'abc'"),
        (
            ["--max-length", "0"],
            "argument --max-length: expected a positive integer or a number of k (1k = 1024), got '0'",
        ),
        (["--batch-size", "two"], "argument --batch-size: --batch-size must be a positive integer, got 'two'"),
        (["--sliding-window", "wide"], "argument --sliding-window: --sliding-window must be keep, none or a positive"),
    ],
)
def test_cli_values_are_typed_by_argparse(argv, message, capsys):
    with pytest.raises(SystemExit):
        _parser().parse_args(["harness", "--tasks", "passkey_2k", *argv])
    assert message in capsys.readouterr().err


def test_typed_values(tmp_path):
    args = _parser().parse_args(
        ["harness", "--tasks", "t", "--factor", "2.5", "--max-length", "4096", "--batch-size", "auto:4"]
    )
    assert (args.factor, args.max_length, args.batch_size, args.sliding_window) == (2.5, 4096, "auto:4", "keep")
    assert _parser().parse_args(["harness", "--tasks", "t", "--batch-size", "8"]).batch_size == 8


def test_ropescale_lm_eval_adds_the_task_folder_and_registers_the_model(monkeypatch):
    import lm_eval.__main__
    from lm_eval.api.registry import model_registry

    seen = []
    monkeypatch.setattr(lm_eval.__main__, "cli_evaluate", lambda: seen.append(list(sys.argv[1:])))
    monkeypatch.setattr(sys, "argv", ["ropescale-lm-eval"])
    lm_eval_cmd.main(["run", "--model", "ropescale", "--tasks", "passkey_4k"])
    lm_eval_cmd.main(["run", "--include_path", "mine", "--tasks", "x"])
    lm_eval_cmd.main(["--help"])
    assert seen[0][-2:] == ["--include_path", str(TASKS_DIR)]
    assert seen[1] == ["run", "--include_path", "mine", "--tasks", "x"]
    assert seen[2] == ["--help"]
    assert "ropescale" in model_registry


def test_console_script_points_at_the_cli():
    from importlib.metadata import entry_points

    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "ropescale-lm-eval"]
    assert script.value == "ropescale.cli.lm_eval:main" and script.load() is lm_eval_cmd.main
