"""A sub-command as a value: its name, its help, how it adds its arguments and what runs.

Each command module ends with its ``COMMAND`` (``train`` holds two: ``train`` and ``export``);
:data:`ropescale.cli.main.COMMANDS` lists them in the order ``ropescale --help`` shows them, and a
group (``eval``, ``data``) installs its own commands the same way. Nothing is looked up by module
name: a command that is renamed or removed fails where it is listed, at import.

The modules keep their heavy imports (torch, transformers, the evaluation runners) inside their
``run`` functions, so building the parser, which imports every command module, stays fast
(``ropescale --help`` loads no torch).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    """One ``ropescale`` sub-command (or one command of a group such as ``eval``)."""

    name: str
    #: the line ``ropescale --help`` lists beside the name
    help: str
    #: the paragraph at the top of ``ropescale NAME --help``
    description: str
    #: adds the command's flags (and, for a group, its own commands) to its parser
    add_arguments: Callable[[argparse.ArgumentParser], None]
    #: what runs, given the parsed arguments; returns the exit status. None for a group, whose
    #: commands each run their own
    run: Callable[[argparse.Namespace], int] | None
    #: the examples below the flags
    epilog: str | None = None
    #: keep the description's and the examples' line breaks (argparse's RawDescriptionHelpFormatter)
    raw: bool = False

    def install(self, commands: argparse._SubParsersAction) -> argparse.ArgumentParser:
        """Add this command to ``commands`` (the sub-parsers of ``ropescale`` or of a group); returns its parser."""
        formatter = {"formatter_class": argparse.RawDescriptionHelpFormatter} if self.raw else {}
        parser = commands.add_parser(
            self.name, help=self.help, description=self.description, epilog=self.epilog, **formatter
        )
        self.add_arguments(parser)
        if self.run is not None:
            parser.set_defaults(func=self.run)
        return parser


__all__ = ["Command"]
