"""One suite for every model: lengths and factors relative to the model's trained context.

A shipped suite names its model (the embedded one); ``ropescale eval suite NAME --model PATH
[--target-length N] [--data D]`` runs it on another. So that one file fits a model trained at 2k
and one trained at 32k, a suite may write, wherever it gives a length (a task's ``lengths``, a
method's ``only``, ``target_length``):

- ``L`` the model's trained context (``original_max_position_embeddings``, as patching reads it),
  ``2L``, ``L/4``, ``1.5L``: a multiple or a fraction of it (rounded down to a token);
- ``target``, ``target/2``: the target length N (``--target-length``, else the suite's
  ``target_length``, itself a number or relative to L, e.g. ``4L``);

and, as a method's factor, ``target/L`` (N / L). Lengths that resolve to the same number are kept
once. Resolving needs only the model's config (no weights), and every mistake is one line naming
the key.
"""

from __future__ import annotations

import copy
import math
import re
from typing import Any

from ropescale.evals.suite.checks import SuiteError

_RELATIVE = re.compile(r"^\s*(?:(\d+(?:\.\d+)?)\s*\*?\s*)?(L|target)\s*(?:/\s*(\d+(?:\.\d+)?))?\s*$")
_FACTOR = re.compile(r"^\s*target\s*/\s*L\s*$")


def is_relative(value: Any) -> bool:
    """Whether ``value`` is a relative length (``L/4``, ``2L``, ``target``)."""
    return isinstance(value, str) and _RELATIVE.match(value) is not None


def _places(raw: dict[str, Any]) -> list[tuple[str, Any]]:
    """Every (key, value) of a suite mapping that may be relative."""
    from ropescale.evals.tasks.task_table import names

    found: list[tuple[str, Any]] = [("target_length", raw.get("target_length"))]
    for task in names():
        settings = raw.get(task)
        if isinstance(settings, dict) and isinstance(settings.get("lengths"), list):
            found += [(f"{task}.lengths", v) for v in settings["lengths"]]
    for i, entry in enumerate(raw.get("methods") or []):
        if isinstance(entry, dict):
            found.append((f"methods[{i}].factor", entry.get("factor")))
            for task, lengths in (entry.get("only") or {}).items() if isinstance(entry.get("only"), dict) else ():
                found += [(f"methods[{i}].only.{task}", v) for v in lengths or [] if isinstance(lengths, list)]
    return found


def _length(key: str, value: Any, L: int, target: int | None, source: str) -> Any:
    if not is_relative(value):
        return value
    scale, base, divisor = _RELATIVE.match(value).groups()
    if base == "target":
        if target is None:
            raise SuiteError(
                f"{key} of {source} is {value!r}, relative to the target length: give --target-length N "
                "(or target_length in the suite)"
            )
        base_value = target
    else:
        base_value = L
    n = int(float(scale or 1) * base_value / float(divisor or 1))
    if n <= 0:
        raise SuiteError(f"{key} of {source} is {value!r}: {n} tokens for this model (L = {L})")
    return n


def prepare(
    raw: Any,
    source: str,
    model: str | None = None,
    target_length: int | None = None,
    data: str | None = None,
) -> Any:
    """The suite mapping ``raw`` for ``model`` (default: its own) with relative lengths resolved.

    Raises:
        SuiteError: a relative value that cannot resolve (``target`` with no target length, a
            factor other than ``target/L``), a target within L, or ``--target-length`` given to a
            suite that names no target.
    """
    if not isinstance(raw, dict):
        return raw  # suite_from_dict says what a suite must be
    raw = copy.deepcopy(raw)
    if model is not None:
        raw["model"] = model
    if data is not None:
        raw["data"] = data
    places = _places(raw)
    for key, value in places:
        if key.endswith(".factor") and isinstance(value, str) and not _FACTOR.match(value):
            try:
                float(value)
            except ValueError:
                raise SuiteError(f"{key} of {source} is {value!r}: a factor is a number or target/L") from None
    uses_target = any((isinstance(v, str) and "target" in v) for k, v in places if k != "target_length")
    if target_length is not None and not uses_target:
        raise SuiteError(f"--target-length {target_length}: {source} gives no length or factor relative to 'target'")
    relative = [(k, v) for k, v in places if is_relative(v) or (isinstance(v, str) and _FACTOR.match(v))]
    if not relative and target_length is None:
        return raw
    from ropescale.models.loading import load_config
    from ropescale.patching.plan import trained_context

    L = trained_context(load_config(str(raw.get("model") or "smollm2-135m")))
    target = (
        target_length
        if target_length is not None
        else _length("target_length", raw.get("target_length"), L, None, source)
    )
    if uses_target and target is not None and target <= L:
        raise SuiteError(
            f"target length {target} of {source} is within the model's trained context {L}; to run a smaller "
            "suite keep the target and give --lengths (e.g. --lengths L/4,L) and --samples N (see --dry-run)"
        )
    raw.pop("target_length", None)
    if uses_target:
        raw["target_length"] = target
    from ropescale.evals.tasks.task_table import names

    for task in names():
        settings = raw.get(task)
        if isinstance(settings, dict) and isinstance(settings.get("lengths"), list):
            resolved = [_length(f"{task}.lengths", v, L, target, source) for v in settings["lengths"]]
            settings["lengths"] = list(dict.fromkeys(resolved))
    for i, entry in enumerate(raw.get("methods") or []):
        if not isinstance(entry, dict):
            continue
        if isinstance(entry.get("factor"), str) and _FACTOR.match(entry["factor"]):
            if target is None:
                raise SuiteError(f"methods[{i}].factor of {source} is 'target/L': give --target-length N")
            entry["factor"] = target / L
        if isinstance(entry.get("only"), dict):
            entry["only"] = {
                task: list(dict.fromkeys(_length(f"methods[{i}].only.{task}", v, L, target, source) for v in lengths))
                if isinstance(lengths, list)
                else lengths
                for task, lengths in entry["only"].items()
            }
    return raw


def check_lengths(suite: Any, original_context: int, shipped_context: int | None = None) -> None:
    """Refuse lengths a scaled method was not scaled for (the unscaled baseline may extrapolate). A method
    composed on the checkpoint's own scaling (``params: {compose: true}``) scales from its shipped context."""
    for entry, task, length in suite.cells():
        factor = float(entry.factor or 1.0)
        context = shipped_context if entry.params.get("compose") and shipped_context else original_context
        if factor > 1 and length > factor * context:
            need = math.ceil(length / context)
            raise SuiteError(
                f"factor {factor:g} of '{entry.label}' is too small for {task} at {length} tokens "
                f"(extended context {int(factor * context)}); use factor >= {need}"
            )


def positive_ints(name: str, values: Any) -> list[int]:
    if not isinstance(values, list) or not values:
        raise SuiteError(f"{name} must be a non-empty list of token counts")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise SuiteError(f"{name} must be positive integers, got {v!r}")
    twice = next((n for i, n in enumerate(values) if n in values[:i]), None)
    if twice is not None:  # one cell per length: the report would show its column twice
        raise SuiteError(f"{name} gives {twice} twice; give each length once")
    return values


__all__ = ["check_lengths", "is_relative", "positive_ints", "prepare"]
