"""The attention-level modes, one row each: the one table the rest of the package reads.

A method class declares the mode it installs (``ScalingMethod.attention``, e.g. ``"self_extend"``);
this table maps each mode to its kernel module (which registers the attention function with
transformers' ``AttentionInterface``), the settings the rotary module carries for it (read from the
method and the model's rotary geometry), whether its keys are kept rotated beside the KV cache
(:mod:`.rotated_cache`), and what ``ropescale search`` searches for it (:mod:`ropescale.search.grid`).
``kv_consistent`` is the one mode no method declares: patching installs it for methods whose
frequencies follow the current length. ``tests/attention/test_modes.py`` fails when a method declares
a mode without its row here, or a row names a kernel that does not exist.

No torch here: the command line reads this table to build its choices.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Mode:
    name: str
    #: module of ``ropescale.attention`` with ``register()`` and the registered ``NAME``
    kernel: str
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


TABLE: dict[str, Mode] = {
    mode.name: mode
    for mode in (
        Mode("kv_consistent", "consistent", lambda method, spec: {}),
        Mode(
            "self_extend",
            "self_extend",
            _self_extend,
            rotated_keys=True,
            search_grid="Self-Extend's group_size and window on a grid (reach ≥ target)",
        ),
        Mode("dca", "dca", _dca, rotated_keys=True, search_grid="DCA's chunk_size and local_window on a grid"),
        Mode(
            "string",
            "string",
            _string,
            rotated_keys=True,
            search_grid="STRING's shift, local_window and frequencies on a grid",
        ),
        Mode("self_extend_llamacpp", "self_extend_llamacpp", _self_extend_llamacpp),
    )
}

#: every mode, in the table's order
MODES = tuple(TABLE)
#: the modes whose kernels read rotated keys kept beside the cache
ROTATED_KEY_MODES = tuple(name for name, mode in TABLE.items() if mode.rotated_keys)
#: the modes ``ropescale search`` searches on a grid (each is also its method's name)
SEARCHED_MODES = tuple(name for name, mode in TABLE.items() if mode.search_grid)


def mode(name: str) -> Mode:
    """The row of ``name``; unknown names get the list of known ones."""
    try:
        return TABLE[name]
    except KeyError:
        raise ValueError(f"unknown attention mode {name!r}; known: {', '.join(MODES)}") from None


__all__ = ["MODES", "ROTATED_KEY_MODES", "SEARCHED_MODES", "TABLE", "Mode", "mode"]
