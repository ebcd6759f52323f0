"""Issue 53: every sub-command is a registered value (``ropescale.cli.command.Command``: name, help, its
arguments, what runs), listed explicitly in ``ropescale.cli.main.COMMANDS`` (groups list their own), never a
module found by name (``__import__``, ``importlib``)."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

from ropescale.cli import data as data_cmd
from ropescale.cli import eval as eval_cmd
from ropescale.cli.command import Command
from ropescale.cli.main import COMMANDS, build_parser

CLI = Path(__file__).resolve().parents[2] / "cli"


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def test_every_subcommand_is_a_listed_command_in_the_order_help_shows():
    parser = build_parser()
    assert all(isinstance(command, Command) for command in COMMANDS)
    assert list(_commands(parser)) == [command.name for command in COMMANDS]
    for command in COMMANDS:
        sub = _commands(parser)[command.name]
        assert sub.description == command.description
        assert sub.get_default("func") is command.run  # None for a group: its commands run


def test_groups_install_their_commands_the_same_way():
    parser = build_parser()
    data = _commands(_commands(parser)["data"])
    assert data["list"].get_default("func") is data_cmd.LIST.run
    tasks = _commands(_commands(parser)["eval"])
    assert list(tasks)[-5:] == ["suite", "harness", "frontier", "ruler", "longppl"]
    assert tasks["suite"].get_default("func") is eval_cmd.SUITE.run


def test_no_command_is_a_module_found_by_name():
    for path in sorted(CLI.glob("*.py")):
        found = [
            ast.unparse(node)
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("__import__", "importlib.import_module")
        ]
        assert found == [], path.name
