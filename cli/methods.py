"""``ropescale methods``: the registered scaling methods as a table that fits 100 columns; their
parameters and defaults with ``--verbose``."""

from __future__ import annotations

import argparse
import dataclasses
import textwrap

from ropescale.cli.command import Command

WIDTH = 100  # a terminal's worth, so no line wraps on its own


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--verbose", "-v", action="store_true", help="also every parameter with its default")


def run(args: argparse.Namespace) -> int:
    from ropescale.methods import METHODS

    print("\n".join(table(METHODS, verbose=getattr(args, "verbose", False))))
    return 0


def table(methods: dict, verbose: bool = False) -> list[str]:
    """The listing's lines: a header, then per method its name, kind and summary, the summary wrapped
    under its own column, and a line with the README's "training-free" and "runs in"; with ``verbose`` a ``parameters:`` line (``<required>`` where there is no
    usable default) under each."""
    width = max(len("method"), *map(len, methods))
    indent = " " * (width + 2 + 7 + 2)
    wrap = textwrap.TextWrapper(width=WIDTH, initial_indent="", subsequent_indent=indent, break_on_hyphens=False)
    lines = [f"{'method':<{width}}  {'kind':<7}  what it does"]
    for name, cls in sorted(methods.items()):
        kind = "dynamic" if cls.dynamic else "static"
        lines += wrap.wrap(f"{name:<{width}}  {kind:<7}  {cls.summary}")
        # the README's two other columns, under the summary: too wide to stand beside it in 100 columns
        lines += textwrap.wrap(
            f"training-free: {cls.training_free}; runs in: {cls.runs_in.replace('`', '')}",
            WIDTH,
            initial_indent=indent,
            subsequent_indent=indent + "  ",
            break_on_hyphens=False,
        )
        if verbose:
            params = ", ".join(
                f"{k}={'<required>' if _required(cls, k, v) else v}" for k, v in cls.parameter_defaults().items()
            )
            lines += textwrap.wrap(f"parameters: {params}", WIDTH, initial_indent=indent, subsequent_indent=indent)
    if not verbose:
        lines.append("parameters and defaults: ropescale methods --verbose")
    return lines


def _required(cls, key: str, default) -> bool:
    if default is dataclasses.MISSING:
        return True
    return (key == "factor" and cls.name != "default") or (key == "long_factor" and default is None)


COMMAND = Command(
    "methods",
    help="list scaling methods (--verbose: their parameters and defaults)",
    description="List the registered scaling methods: name, static or dynamic, what each does, whether it "
    "works without training and which loaders run it.",
    add_arguments=add_arguments,
    run=run,
    epilog="examples:\n  ropescale methods\n  ropescale methods --verbose",
    raw=True,
)
