"""``ropescale search`` is built from SearchOptions: each option is described once (default, help,
flag in the field's metadata), and the parsed command line gives back the dataclass."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import fields

import pytest

from ropescale.cli.main import build_parser
from ropescale.options import from_arguments
from ropescale.search.options import SearchOptions, baselines_for

#: fields taken from the shared --model / runtime flags, and the one without a flag
SHARED = {"model", "dtype", "device", "attn_implementation"}
NO_FLAG = {"heldout"}


def parse(*argv: str):
    args = build_parser().parse_args(["search", "--output", "out", *argv])
    return from_arguments(SearchOptions, args, baselines=baselines_for(args.baselines, args.method))


def test_every_field_has_its_flag_and_help():
    search = build_parser()._subparsers._group_actions[0].choices["search"]
    dests = {a.dest: a for a in search._actions}
    for f in fields(SearchOptions):
        if f.name in SHARED | NO_FLAG:
            assert "help" not in f.metadata and f.name in dests | {"heldout": None}
            continue
        assert f.metadata.get("help"), f"SearchOptions.{f.name} has no help"
        assert f.name in dests and dests[f.name].help == f.metadata["help"], f.name


def test_defaults_are_the_dataclass_defaults():
    assert parse("--target-length", "32768") == SearchOptions(target_length=32768)


def test_flags_reach_the_fields():
    options = parse(
        "--target-length", "16384", "--method", "self_extend", "--attention-factor", "yarn", "--floor", "off",
        "--needle-depths", "0.1,0.9", "--report-lengths", "16384,32768", "--dtype", "bfloat16",
    )  # fmt: skip
    assert options.method == "self_extend" and options.attention == "yarn" and options.floor is False
    assert options.needle_depths == (0.1, 0.9) and options.report_lengths == (16384, 32768)
    assert options.baselines == ("self_extend", "linear", "ntk", "dynamic_ntk", "yarn") and options.dtype == "bfloat16"
    assert parse("--target-length", "16384", "--method", "string").baselines[0] == "linear"
    with pytest.raises(ValueError, match="--needle-depths must be comma-separated numbers"):
        parse("--target-length", "16384", "--needle-depths", "a,b")


def test_the_parser_does_not_load_torch():
    code = "import sys; from ropescale.cli.main import build_parser; build_parser(); print('torch' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
        == "False"
    )
