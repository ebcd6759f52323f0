"""``ropescale data list``: the training text sources there are, or a recipe's mix, with their sizes."""

from __future__ import annotations

import argparse

from ropescale.cli.command import Command

EXAMPLES = """examples:
  ropescale data list                                    # embedded corpora and Python source trees here
  ropescale data list --config my-recipe.yaml            # the recipe's data.sources with weights
  ropescale data list ./books python:/opt/project/src    # any data.source values
"""

BUILT_IN = ("austen", "kjv", "python:stdlib", "python:packages")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``data``'s own commands (one so far: ``list``)."""
    LIST.install(p.add_subparsers(dest="data_command", metavar="COMMAND", required=True))


def add_list_arguments(lst: argparse.ArgumentParser) -> None:
    lst.add_argument("sources", nargs="*", metavar="SOURCE", help="data.source values (corpus, path, python:...)")
    lst.add_argument("--config", default=None, metavar="RECIPE", help="list this recipe's data.sources (or source)")


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def run_list(args: argparse.Namespace) -> int:
    from ropescale.data.sources import SourceSpec, describe_source, parse_sources

    if args.config:
        from ropescale.training.config import load_config

        data = load_config(args.config).data
        specs = parse_sources(data.sources) if data.sources else [SourceSpec(data.source)]
    else:
        specs = [SourceSpec(s) for s in (args.sources or BUILT_IN)]
    total = sum(s.weight for s in specs)
    width = max(len(s.label) for s in specs)
    print(f"{'source':<{width}}  {'share':>6}  {'documents':>9}  {'size':>9}  note")
    for spec in specs:
        info = describe_source(spec)
        docs = "-" if info["documents"] is None else f"{info['documents']:,d}"
        share = f"{spec.weight / total:.0%}" if args.config else "-"
        print(f"{spec.label:<{width}}  {share:>6}  {docs:>9}  {_size(info['bytes']):>9}  {info['note']}")
    return 0


LIST = Command(
    "list",
    help="sources with documents and bytes (no tokenizing)",
    description="List sources with their documents and sizes in bytes, read from file sizes (nothing is "
    "tokenized). Without arguments: the embedded corpora and the Python source trees of this machine.",
    add_arguments=add_list_arguments,
    run=run_list,
    epilog=EXAMPLES,
    raw=True,
)
COMMAND = Command(
    "data",
    help="list training text sources and their sizes (data.sources)",
    description="Training text: the sources a recipe's data.sources can mix, with their documents and sizes.",
    add_arguments=add_arguments,
    run=None,
    epilog=EXAMPLES,
    raw=True,
)
