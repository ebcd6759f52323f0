"""The attention-level modes are listed once (``ropescale/attention/modes.py``): every mode a method
declares has its row, every row's kernel exists and registers, and everything else that lists modes
(install, the rotated-key buffers, the search grid, the command line) reads the table."""

from __future__ import annotations

import importlib

import pytest

from ropescale import attention
from ropescale.attention import modes, rotated_cache
from ropescale.cli.main import build_parser
from ropescale.methods import METHODS, ScalingMethod, method_class
from ropescale.search import grid


def declared() -> dict[str, str]:
    """method name -> the mode its class declares, for every registered method that declares one."""
    return {name: cls.attention for name, cls in METHODS.items() if cls.attention}


def test_every_declared_mode_has_its_row():
    missing = {name: mode for name, mode in declared().items() if mode not in modes.TABLE}
    assert not missing, f"methods declare attention modes without a row in ropescale/attention/modes.py: {missing}"


def test_every_row_is_used_and_has_a_kernel():
    used = set(declared().values()) | {"kv_consistent"}  # patching installs kv_consistent itself
    assert set(modes.TABLE) == used
    for row in modes.TABLE.values():
        kernel = importlib.import_module(f"ropescale.attention.{row.kernel}")
        assert callable(kernel.register), row.name
        assert hasattr(kernel, "NAME") or hasattr(kernel, "NAMES"), row.name


def test_the_table_is_the_only_list():
    assert attention.MODES == modes.MODES
    assert rotated_cache.MODES == modes.ROTATED_KEY_MODES
    assert grid.ATTENTION_METHODS == modes.SEARCHED_MODES
    search = next(
        a for a in build_parser()._subparsers._group_actions[0].choices["search"]._actions if a.dest == "method"
    )
    assert set(modes.SEARCHED_MODES) <= set(search.choices)
    for name in modes.SEARCHED_MODES:  # a searched mode is its method's name
        assert method_class(name).attention == name


def test_a_new_mode_without_its_row_is_refused():
    """What the first test guards against, shown: a method declaring an unknown mode fails to install."""
    with pytest.raises(ValueError, match="unknown attention mode 'grouped'; known: kv_consistent, self_extend"):
        modes.mode("grouped")
    assert ScalingMethod.attention is None  # frequency-only methods declare nothing
