"""The attention-level modes are listed once (``ropescale/attention/modes.py``): every mode a method
declares has its row, every row has its kernel in one table of imported functions
(``ropescale/attention/kernels.py``, no module names resolved by importlib), and everything else that
lists modes (install, the rotated-key buffers, the search grid, the command line) reads the table."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from ropescale import attention
from ropescale.attention import (
    consistent,
    dca,
    kernels,
    modes,
    rotated_cache,
    self_extend,
    self_extend_llamacpp,
    string,
)
from ropescale.cli.main import build_parser
from ropescale.methods import METHODS, ScalingMethod, method_class
from ropescale.methods.self_extend import SelfExtend
from ropescale.patching.plan import plan_patch
from ropescale.search import grid
from tests.conftest import tiny_config


def declared() -> dict[str, str]:
    """method name -> the mode its class declares, for every registered method that declares one."""
    return {name: cls.attention for name, cls in METHODS.items() if cls.attention}


def test_every_declared_mode_has_its_row():
    missing = {name: mode for name, mode in declared().items() if mode not in modes.TABLE}
    assert not missing, f"methods declare attention modes without a row in ropescale/attention/modes.py: {missing}"


def test_every_row_is_used_and_has_a_kernel():
    used = set(declared().values()) | {"kv_consistent"}  # patching installs kv_consistent itself
    assert set(modes.TABLE) == used
    assert [kernel.mode for kernel in kernels.KERNELS.values()] == list(modes.TABLE.values())
    assert {name: kernels.kernel(name).register for name in modes.TABLE} == {
        "kv_consistent": consistent.register,
        "self_extend": self_extend.register,
        "dca": dca.register,
        "string": string.register,
        "self_extend_llamacpp": self_extend_llamacpp.register,
    }
    assert kernels.kernel("kv_consistent").names == consistent.NAMES
    assert kernels.kernel("string").name("sdpa") == string.NAME == "ropescale_string"


def test_no_mode_is_a_module_name_resolved_at_run_time():
    """Issue 53: a mode becomes its kernel through imports, so a renamed kernel module fails at import,
    not when a model is first patched with it."""
    for path in Path(attention.__file__).parent.glob("*.py"):
        calls = [
            ast.unparse(node.func)
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call) and "import_module" in ast.unparse(node.func)
        ]
        assert calls == [], path.name


def test_a_row_without_its_kernel_refuses_to_import(monkeypatch):
    row = modes.AttentionMode("grouped", lambda method, spec: {})
    monkeypatch.setitem(modes.TABLE, "grouped", row)
    try:
        with pytest.raises(ImportError, match=r"kernels for \[.*\], but the modes are \[.*'grouped'\]"):
            importlib.reload(kernels)
    finally:
        monkeypatch.undo()
        importlib.reload(kernels)


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


def test_a_method_declaring_an_unknown_mode_is_refused_when_planned():
    """Methods name their mode (the methods room sits below attention); the name is checked against the
    table when the plan is made, before any weights load, not when the kernel is first installed."""

    class Grouped(SelfExtend):
        attention = "grouped"

    with pytest.raises(ValueError, match="unknown attention mode 'grouped'; known: kv_consistent, self_extend"):
        plan_patch(tiny_config(), Grouped(factor=2.0))
    assert plan_patch(tiny_config(), SelfExtend(factor=2.0)).attention_mode == "self_extend"
