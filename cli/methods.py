"""``ropescale methods``: the registered scaling methods, one line each."""

from __future__ import annotations

import argparse
import dataclasses


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "methods",
        help="list scaling methods, their parameters and defaults",
        description="List the registered scaling methods with their parameters and defaults.",
        epilog="example: ropescale methods",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ropescale.methods import METHODS

    width = max(map(len, METHODS))
    for name, cls in sorted(METHODS.items()):
        params = ", ".join(
            f"{k}={'<required>' if _required(cls, k, v) else v}" for k, v in cls.parameter_defaults().items()
        )
        kind = "dynamic" if cls.dynamic else "static"
        print(f"{name:<{width}}  {kind:<7}  {cls.summary}  [{params}]")
    return 0


def _required(cls, key: str, default) -> bool:
    if default is dataclasses.MISSING:
        return True
    return (key == "factor" and cls.name != "default") or (key == "long_factor" and default is None)
