"""The attention-level modes, one row each: the one table the rest of the package reads.

A method class declares the mode it installs (``ScalingMethod.attention``, e.g. ``"self_extend"``);
this table holds one :class:`AttentionMode` per mode: the settings the rotary module carries for it
(read from the method and the model's rotary geometry), whether its keys are kept rotated beside the
KV cache (:mod:`.rotated_cache`), and what ``ropescale search`` searches for it
(:mod:`ropescale.search.grid`). Its kernel (the attention function registered with transformers'
``AttentionInterface``) is paired with it in :mod:`.kernels`, by import, not by module name.
``kv_consistent`` is the one mode no method declares: patching installs it for methods whose
frequencies follow the current length. ``tests/attention/test_modes.py`` fails when a method declares
a mode without its row here; :mod:`.kernels` refuses to import when a row has no kernel.

No torch here: the command line reads this table to build its choices, and the kernels (torch) import
this module, never the other way round (so the table cannot make an import circle).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class AttentionMode:
    """One attention-level mode: what installing it needs besides its kernel (:mod:`.kernels`)."""

    name: str
    #: ``(method, spec) -> {attribute: value}`` set on the :class:`~.rotary.AttentionRotary`
    settings: Callable[[Any, Any], dict[str, Any]]
    #: the kernel reads keys rotated once and kept beside the cache (:mod:`.rotated_cache`)
    rotated_keys: bool = False
    #: what ``ropescale search --method NAME`` searches (empty: the mode is not searched)
    search_grid: str = ""


def _self_extend(method: Any, spec: Any) -> dict[str, Any]:
    return {
        "group_size": method.resolved_group_size(spec),
        "window": method.resolved_window(spec),
        "fractional": method.fractional,
    }


def _dca(method: Any, spec: Any) -> dict[str, Any]:
    return {"chunk_size": method.resolved_chunk_size(spec), "local_window": method.resolved_local_window(spec)}


def _string(method: Any, spec: Any) -> dict[str, Any]:
    return {"shift": method.resolved_shift(spec), "local_window": method.resolved_local_window(spec)}


def _self_extend_llamacpp(method: Any, spec: Any) -> dict[str, Any]:
    params = method.resolved_params(spec)
    return {k: params[k] for k in ("group_size", "window", "n_batch", "kshift") if k in params}


KV_CONSISTENT = AttentionMode("kv_consistent", lambda method, spec: {})
SELF_EXTEND = AttentionMode(
    "self_extend",
    _self_extend,
    rotated_keys=True,
    search_grid="Self-Extend's group_size and window on a grid (reach ≥ target)",
)
DCA = AttentionMode("dca", _dca, rotated_keys=True, search_grid="DCA's chunk_size and local_window on a grid")
STRING = AttentionMode(
    "string",
    _string,
    rotated_keys=True,
    search_grid="STRING's shift, local_window and frequencies on a grid",
)
SELF_EXTEND_LLAMACPP = AttentionMode("self_extend_llamacpp", _self_extend_llamacpp)

TABLE: dict[str, AttentionMode] = {
    mode.name: mode for mode in (KV_CONSISTENT, SELF_EXTEND, DCA, STRING, SELF_EXTEND_LLAMACPP)
}

#: every mode, in the table's order
MODES = tuple(TABLE)
#: the modes whose kernels read rotated keys kept beside the cache
ROTATED_KEY_MODES = tuple(name for name, mode in TABLE.items() if mode.rotated_keys)
#: the modes ``ropescale search`` searches on a grid (each is also its method's name)
SEARCHED_MODES = tuple(name for name, mode in TABLE.items() if mode.search_grid)


def mode(name: str) -> AttentionMode:
    """The row of ``name``; unknown names get the list of known ones."""
    try:
        return TABLE[name]
    except KeyError:
        raise ValueError(f"unknown attention mode {name!r}; known: {', '.join(MODES)}") from None


__all__ = [
    "DCA",
    "KV_CONSISTENT",
    "MODES",
    "ROTATED_KEY_MODES",
    "SEARCHED_MODES",
    "SELF_EXTEND",
    "SELF_EXTEND_LLAMACPP",
    "STRING",
    "TABLE",
    "AttentionMode",
    "mode",
]
