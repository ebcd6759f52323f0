"""Checks of a suite that :mod:`ropescale.evals.suite.runner` runs before it loads anything.

:func:`check_raw` takes the suite as read from YAML (types, known keys, task settings);
:func:`check_against_model` takes the parsed suite and the model's config and plans every method's
patch on it, so a parameter the model cannot take (a ``long_factor`` of the wrong length, a
Self-Extend window wider than the context) fails before the tokenizer and the weights load.
Every failure is one line naming the key.
"""

from __future__ import annotations

import numbers
from typing import Any

from ropescale.errors import RopescaleError
from ropescale.evals.tasks.task_base import SuiteError

METHOD_KEYS = ("method", "factor", "params", "label", "only")
STRING_KEYS = ("name", "model", "dtype", "device", "attn_implementation", "data", "note", "sized")


def _int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_task(task: str, settings: Any) -> None:
    """The settings of one task: known keys, and each value of the kind its field takes (the task's
    row in :mod:`.task_table` declares both)."""
    from ropescale.evals.tasks import task_table

    if not isinstance(settings, dict):
        return  # "must be a mapping with at least 'lengths'" is the suite's own message
    task_table.get(task).check(settings)


def check_method(i: int, entry: Any) -> None:
    """One ``methods`` entry: a name, or a mapping of known keys with a number factor and mapping params."""
    if isinstance(entry, str) or not isinstance(entry, dict):
        return  # names and non-mappings: the suite's own messages
    unknown = sorted(set(entry) - set(METHOD_KEYS))
    if unknown:
        raise SuiteError(f"unknown key '{unknown[0]}' in methods[{i}]; known: {', '.join(METHOD_KEYS)}")
    factor = entry.get("factor")
    if factor is not None and (isinstance(factor, bool) or not isinstance(factor, (numbers.Real, str))):
        raise SuiteError(f"methods[{i}].factor must be a number, got {factor!r}")
    params = entry.get("params")
    if params is not None and not isinstance(params, dict):
        raise SuiteError(f"methods[{i}].params must be a mapping of method parameters, got {params!r}")
    for key in ("factor", "method"):
        if key in (params or {}):
            raise SuiteError(f"methods[{i}].params: give {key} as methods[{i}].{key}, not among the params")
    label = entry.get("label")
    if label is not None and not isinstance(label, (str, numbers.Real)):
        raise SuiteError(f"methods[{i}].label must be a string, got {label!r}")


def check_raw(raw: dict[str, Any]) -> None:
    """Everything about a suite mapping that needs no model: types, keys, task settings."""
    for key in STRING_KEYS:
        if raw.get(key) is not None and not isinstance(raw[key], str):
            raise SuiteError(f"{key} must be a string, got {raw[key]!r}")
    if raw.get("seed") is not None and not _int(raw["seed"]):
        raise SuiteError(f"seed must be an integer, got {raw['seed']!r}")
    methods = raw.get("methods")
    if methods is not None and not isinstance(methods, list):
        raise SuiteError(f"methods must be a list of methods (names or mappings), got {methods!r}")
    for i, entry in enumerate(methods or []):
        check_method(i, entry)
    from ropescale.evals.tasks import task_table

    for task in task_table.names():
        if raw.get(task) is not None:
            check_task(task, raw[task])


def entry_kernel(method: str, factor: Any, params: dict[str, Any], requested: str) -> str:
    """The attention kernel a suite method runs on when the suite asks for ``requested``: an
    attention-level mode (Self-Extend, the KV-consistent mode) runs SDPA (or eager) whatever was asked."""
    from ropescale.attention import kernel_for
    from ropescale.methods import get_method
    from ropescale.patching.plan import attention_mode, kv_consistent_option

    # patch options, not the method's parameters (a method composed on a shipped scaling runs the same kernel)
    method_params = {k: v for k, v in params.items() if k not in ("kv_consistent", "compose")}
    scaling = get_method(method, **method_params, **({"factor": factor} if factor is not None else {}))
    return kernel_for(attention_mode(scaling, kv_consistent_option(scaling, params.get("kv_consistent"))), requested)


def check_against_model(suite: Any, config: Any) -> None:
    """Plan every method's patch on the model's config (no weights): what needs its geometry fails here."""
    import copy
    import warnings
    from pathlib import Path

    from ropescale.models.runnable import check_partial_rotary
    from ropescale.patching.model import apply_plan
    from ropescale.patching.plan import plan_scaling

    name = str(getattr(config, "_name_or_path", "") or suite.model)
    source = str(Path(name) / "config.json") if (Path(name) / "config.json").is_file() else name
    for i, entry in enumerate(suite.methods):
        if str(entry.method).lower() == "saved":  # nothing to plan: the checkpoint's own scaling
            continue
        try:
            plan = plan_scaling(config, entry.scaling)  # built on the shipped scaling, else replacing it
            # the suite patches the loaded model in place, past from_pretrained's own check: a scaled
            # rotary of part of a head on an attention that rotates all of it failed on the first batch
            scaled = copy.deepcopy(config)
            with warnings.catch_warnings():  # apply_plan's sliding-window warning is the run's to give
                warnings.simplefilter("ignore")
                apply_plan(scaled, plan)
            check_partial_rotary(scaled, source)
        except (ValueError, RopescaleError) as exc:
            raise SuiteError(f"methods[{i}] ('{entry.label}'): {' '.join(str(exc).split())}") from None


__all__ = ["SuiteError", "check_against_model", "entry_kernel", "check_method", "check_raw", "check_task"]
