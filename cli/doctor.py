"""``ropescale doctor``: which loaders keep a checkpoint's RoPE scaling (reads config.json only)."""

from __future__ import annotations

import argparse
import contextlib
import json
import warnings
from pathlib import Path

from ropescale.cli.command import Command

EXAMPLES = """examples:
  ropescale doctor ./llama-yarn4                 # a checkpoint directory
  ropescale doctor org/name                      # config.json alone from the Hub
  ropescale doctor ./llama-yarn4 --json          # for scripts
  ropescale doctor ./llama-yarn4 --engines transformers,vllm
  ropescale doctor ./llama-yarn4 --engines vllm==0.19.1:transformers==4.57.6,sglang==0.5.23

exit status: 0 when no listed engine drops the scaling or fails on it; 1 when one would (a loss:
re-save the checkpoint with this ropescale, it writes the keys that engine reads; a failure: that
engine cannot serve this method, see docs/engines.md); 2 for bad input.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ropescale.interop.engines import ENGINES

    p.add_argument("model", metavar="DIR|org/name", help="checkpoint directory, config.json file, or Hub id")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    keys = ", ".join(e.key for e in ENGINES)
    p.add_argument(
        "--engines",
        default=None,
        metavar="LIST",
        help=f"comma-separated engines to judge (default all): row prefixes ({keys}) or versions, "
        "e.g. vllm==0.19.1:transformers==4.57.6 (the transformers beside it decides what it reads)",
    )


def run(args: argparse.Namespace) -> int:
    from ropescale.interop.engines import select
    from ropescale.interop.verdict import check, format_table, read_config_json, verdict_line
    from ropescale.methods.self_extend_llamacpp import llamacpp_note_for_config

    engines = select(args.engines)
    data, source = read_config_json(args.model)
    from ropescale.models.checkpoint import unmark_config_dict
    from ropescale.models.config_check import check_config_dict, check_with_transformers

    where = str(Path(source) / "config.json" if Path(source).is_dir() else source)
    check_config_dict(unmark_config_dict(data), where, shape=False)  # the engines' answer reads only the rope
    check_with_transformers(unmark_config_dict(data), where)  # the pass every command shares: BERT, odd heads...
    report = check(data, source, engines)
    note = llamacpp_note_for_config(data)  # Self-Extend: the llama-completion flags
    if args.json:
        print(json.dumps(dict(report.to_json(), **({"llama_cpp_self_extend": note} if note else {})), indent=2))
    else:
        print(verdict_line(report))  # the answer first, then the table
        print(format_table(report))
        if note:
            print(note)
        if report.loses:
            names = ", ".join(f"{v.name} {v.versions}" for v in report.loses)
            print(
                f"{len(report.loses)} loader(s) would silently drop the scaling ({names}); "
                "re-save it with ropescale to write the keys they read"
            )
        if report.fails:
            names = ", ".join(f"{v.name} {v.versions}" for v in report.fails)
            print(f"{len(report.fails)} loader(s) fail on it ({names}): serve it elsewhere or use another method")
    return 1 if report.loses or report.fails else 0


def print_saved(directory: str | Path, verbose: bool = False) -> None:
    """After a save (patch --output, export): which loaders keep the written config.json's scaling, in one
    line, with the note where a loader needs one; the table with ``verbose`` (or ``ropescale doctor DIR``)."""
    from ropescale.interop.verdict import check, format_table, read_config_json, verdict_line

    data, _ = read_config_json(str(directory))
    report = check(data, f"{directory}/config.json")
    if verbose:
        print(format_table(report))
        return
    print("loaders: " + verdict_line(report))
    if report.note:
        print(f"note: {report.note}")
    print(f"table:   ropescale doctor {directory}")


@contextlib.contextmanager
def saving_quietly():
    """Around a save in the CLI: drop save_pretrained's one-line warning (:func:`print_saved` prints it)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*cannot be expressed outside ropescale", category=UserWarning)
        warnings.filterwarnings("ignore", message=".* in serving engines: ", category=UserWarning)
        yield


COMMAND = Command(
    "doctor",
    help="say which loaders (transformers 4/5, vLLM, SGLang, TGI, llama.cpp) keep a checkpoint's RoPE scaling",
    description="Read a checkpoint's config.json (no weights) and say, for each loader, whether it keeps "
    "the RoPE scaling, approximates it, loses it silently, fails, or cannot express it, and why.",
    add_arguments=add_arguments,
    run=run,
    epilog=EXAMPLES,
    raw=True,
)
