"""``ropescale config-path``: where a shipped accelerate config or training recipe is installed."""

from __future__ import annotations

import argparse

from ropescale.cli.command import Command

EXAMPLES = """examples:
  accelerate launch --config_file "$(ropescale config-path fsdp)" --num_processes 8 \\
      -m ropescale.cli.main train --config llama2-7b/yarn_x16
  ropescale config-path --list
  cp "$(ropescale config-path llama2-7b/yarn_x8)" my-recipe.yaml      # start a recipe of your own
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", nargs="?", metavar="NAME", help="ddp, fsdp, or a recipe name such as llama2-7b/yarn_x8")
    p.add_argument("--list", action="store_true", help="list every shipped config with its path")


def run(args: argparse.Namespace) -> int:
    from ropescale.shipped import accelerate_configs, config_path, recipes

    if args.list:
        for kind, table in (("accelerate", accelerate_configs()), ("recipe", recipes())):
            for name, path in table.items():
                print(f"{kind:<10}  {name:<34}  {path}")
        return 0
    if not args.name:
        raise ValueError("give a config name (ddp, fsdp, a recipe) or --list")
    print(config_path(args.name))
    return 0


COMMAND = Command(
    "config-path",
    help="print the path of a shipped accelerate config (ddp, fsdp) or training recipe",
    description="Print where a configuration file that ships with ropescale is installed, so it can be "
    "used without a checkout of the repository.",
    add_arguments=add_arguments,
    run=run,
    epilog=EXAMPLES,
    raw=True,
)
