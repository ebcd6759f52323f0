"""One suite for every model: lengths and factors relative to the model's trained and shipped contexts.

A shipped suite names its model (the embedded one); ``ropescale eval suite NAME --model PATH
[--target-length N] [--data D]`` runs it on another. So that one file fits a model trained at 2k
and one trained at 32k, a suite may write, wherever it gives a length (a task's ``lengths``, a
method's ``only``, ``target_length``):

- ``L`` the model's trained (pretraining) context, as patching starts from it
  (``original_max_position_embeddings`` of a scaled checkpoint; the family table's where an unscaled
  config.json overstates it), ``2L``, ``L/4``, ``1.5L``: a multiple or a fraction of it (rounded down
  to a token);
- ``S`` the context the checkpoint serves as shipped (:func:`ropescale.patching.shipped.shipped_of`:
  ropescale's provenance, the family table, else ``max_position_embeddings``), ``2S``, ``S/4``: on an
  already extended checkpoint (Llama 3.1: L = 8,192, S = 131,072) the model as shipped is the baseline
  (issue 51), and ``L`` alone would measure it at a sixteenth of what it serves; on a checkpoint that
  ships no scaling S is L;
- ``target``, ``target/2``: the target length N (``--target-length``, else the suite's
  ``target_length``, itself a number or relative to L or S, e.g. ``4L``, ``4S``);

and, as a method's factor, ``target/L`` (N / L: a method that replaces the shipped scaling starts
from the pretraining frequencies) or ``target/S`` (N / S: a method composed on the shipped scaling,
``params: {compose: true}``, scales from the shipped context; where S is not L, ``target/L`` there
is refused, as it would overshoot by S / L, and ``target/S`` on a replacing method, which would fall
short by as much). Lengths that resolve to the same number are kept once. Resolving needs
only the model's config (no weights), and every mistake is one line naming the key; which context
each symbol took, and from where, is :attr:`Resolved.contexts` (the dry run prints it).
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass
from typing import Any

from ropescale.evals.suite.checks import SuiteError

_RELATIVE = re.compile(r"^\s*(?:(\d+(?:\.\d+)?)\s*\*?\s*)?(L|S|target)\s*(?:/\s*(\d+(?:\.\d+)?))?\s*$")
_FACTOR = re.compile(r"^\s*target\s*/\s*(L|S)\s*$")


def is_relative(value: Any) -> bool:
    """Whether ``value`` is a relative length (``L/4``, ``2L``, ``S``, ``target``)."""
    return isinstance(value, str) and _RELATIVE.match(value) is not None


def _factor_symbol(value: Any) -> str | None:
    """``"L"`` or ``"S"`` for a factor written ``target/L`` or ``target/S``, else None."""
    match = _FACTOR.match(value) if isinstance(value, str) else None
    return match.group(1) if match else None


@dataclass(frozen=True)
class Contexts:
    """The two contexts a suite's relative lengths are measured in, each with where it came from."""

    L: int  # the pretraining context, as patching reads it (what a replacing method's factor multiplies)
    L_source: str
    S: int  # the context the checkpoint serves as shipped (what a composed method's factor multiplies)
    S_source: str

    def of(self, symbol: str) -> int:
        return self.S if symbol == "S" else self.L

    def describe(self) -> str:
        """``L = 8,192 (pretraining: ...), S = 131,072 (shipped: ...)``"""
        return f"L = {self.L:,} (pretraining: {self.L_source}), S = {self.S:,} (shipped: {self.S_source})"


def contexts_of(config: Any, shipped_context: int | None = None, said: str = "--shipped-context") -> Contexts:
    """L and S of a model's config, both from :func:`~ropescale.patching.shipped.shipped_of`: L is the
    pretraining context a replacing patch starts from (:func:`~ropescale.patching.plan.plan_scaling`
    takes the family table's where config.json overstates it: 32,768 on Qwen3-8B, not the 40,960 its
    field states), S the context it serves as shipped, which a composed patch and the runner's length
    check start from; so a factor written ``target/L`` or ``target/S`` is the one the patch multiplies."""
    from ropescale.patching.shipped import shipped_of

    shipped = shipped_of(config, shipped_context)
    source = said if shipped_context is not None else shipped.context_source
    return Contexts(shipped.pretraining, shipped.pretraining_source, shipped.context, source)


@dataclass(frozen=True)
class Resolved:
    """A suite mapping with its relative lengths resolved, and the line saying what they were resolved
    against (None where the suite wrote no relative length or factor: its output is as before)."""

    raw: Any
    contexts: str | None = None


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


def _length(key: str, value: Any, contexts: Contexts, target: int | None, source: str) -> Any:
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
        base_value = contexts.of(base)
    n = int(float(scale or 1) * base_value / float(divisor or 1))
    if n <= 0:
        raise SuiteError(f"{key} of {source} is {value!r}: {n} tokens for this model ({base} = {base_value})")
    return n


def _composes(entry: Any) -> bool:
    return isinstance(entry, dict) and isinstance(entry.get("params"), dict) and entry["params"].get("compose") is True


def prepare(
    raw: Any,
    source: str,
    model: str | None = None,
    target_length: int | None = None,
    data: str | None = None,
    shipped_context: int | None = None,
) -> Resolved:
    """The suite mapping ``raw`` for ``model`` (default: its own) with relative lengths resolved.

    Raises:
        SuiteError: a relative value that cannot resolve (``target`` with no target length, a
            factor other than ``target/L`` or ``target/S``), a target within L (within S for a
            ``target/S`` factor), where S is not L ``target/L`` on a method composed on the shipped
            scaling or ``target/S`` on one that replaces it, or ``--target-length`` given to a suite
            that names no target.
    """
    if not isinstance(raw, dict):
        return Resolved(raw)  # suite_from_dict says what a suite must be
    raw = copy.deepcopy(raw)
    if model is not None:
        raw["model"] = model
    if data is not None:
        raw["data"] = data
    said = "the suite's shipped_context"
    if shipped_context is not None:
        raw["shipped_context"], said = shipped_context, "--shipped-context"
    places = _places(raw)
    for key, value in places:
        if key.endswith(".factor") and isinstance(value, str) and not _factor_symbol(value):
            try:
                float(value)
            except ValueError:
                raise SuiteError(
                    f"{key} of {source} is {value!r}: a factor is a number, target/L or target/S"
                ) from None
    uses_target = any((isinstance(v, str) and "target" in v) for k, v in places if k != "target_length")
    if target_length is not None and not uses_target:
        raise SuiteError(f"--target-length {target_length}: {source} gives no length or factor relative to 'target'")
    relative = [(k, v) for k, v in places if is_relative(v) or _factor_symbol(v)]
    if not relative and target_length is None:
        return Resolved(raw)
    from ropescale.models.loading import load_config

    given = raw.get("shipped_context")  # suite_from_dict says what a shipped_context must be
    given = given if isinstance(given, int) and not isinstance(given, bool) and given > 0 else None
    contexts = contexts_of(load_config(str(raw.get("model") or "smollm2-135m")), given, said)
    L, S = contexts.L, contexts.S
    for i, entry in enumerate(raw.get("methods") or []):
        symbol = _factor_symbol(entry.get("factor")) if isinstance(entry, dict) else None
        if not _composes(entry) and symbol == "S" and S != L:
            # a replacing method multiplies L: target/S would reach target x L / S (a sixteenth on Llama 3.1)
            raise SuiteError(
                f"methods[{i}].factor of {source} is 'target/S' on a method that replaces the shipped scaling, "
                f"which starts from the pretraining context L = {L:,} ({contexts.L_source}), not S = {S:,}: "
                "write target/L, or params: {compose: true} to build on the shipped scaling"
            )
        if _composes(entry) and symbol == "L" and S != L:
            raise SuiteError(
                f"methods[{i}].factor of {source} is 'target/L' on a method composed on the shipped scaling "
                f"(params.compose: true), which scales from the shipped context S = {S:,} ({contexts.S_source}), "
                f"not L = {L:,}: write target/S"
            )
    target = (
        target_length
        if target_length is not None
        else _length("target_length", raw.get("target_length"), contexts, None, source)
    )
    target_said = "--target-length" if target_length is not None else f"target_length: {raw.get('target_length')}"
    if uses_target and target is not None and target <= L:
        raise SuiteError(
            f"target length {target} of {source} is within the model's trained context {L}; to run a smaller "
            "suite keep the target and give --lengths (e.g. --lengths L/4,L) and --samples N (see --dry-run)"
        )
    over_s = any(_factor_symbol(e.get("factor")) == "S" for e in raw.get("methods") or [] if isinstance(e, dict))
    if over_s and target is not None and target <= S:
        raise SuiteError(
            f"target length {target} of {source} is within the model's shipped context S = {S:,} "
            f"({contexts.S_source}): a factor target/S would not extend it; give a target past S "
            f"(--target-length N above {S}, or target_length: 2S)"
        )
    raw.pop("target_length", None)
    if uses_target:
        raw["target_length"] = target
    from ropescale.evals.tasks.task_table import names

    for task in names():
        settings = raw.get(task)
        if isinstance(settings, dict) and isinstance(settings.get("lengths"), list):
            resolved = [_length(f"{task}.lengths", v, contexts, target, source) for v in settings["lengths"]]
            settings["lengths"] = list(dict.fromkeys(resolved))
    for i, entry in enumerate(raw.get("methods") or []):
        if not isinstance(entry, dict):
            continue
        symbol = _factor_symbol(entry.get("factor"))
        if symbol:
            if target is None:
                raise SuiteError(f"methods[{i}].factor of {source} is 'target/{symbol}': give --target-length N")
            entry["factor"] = target / contexts.of(symbol)
        if isinstance(entry.get("only"), dict):
            entry["only"] = {
                task: list(
                    dict.fromkeys(_length(f"methods[{i}].only.{task}", v, contexts, target, source) for v in lengths)
                )
                if isinstance(lengths, list)
                else lengths
                for task, lengths in entry["only"].items()
            }
    said = contexts.describe() + (
        f"; target = {target:,} ({target_said})" if uses_target and target is not None else ""
    )
    return Resolved(raw, f"Relative lengths resolved with {said}")


def check_lengths(suite: Any, original_context: int, shipped_context: int | None = None) -> None:
    """Refuse lengths a scaled method was not scaled for (the unscaled baseline may extrapolate). A method
    composed on the checkpoint's own scaling (``params: {compose: true}``) scales from its shipped context."""
    for entry, task, length in suite.cells():
        factor = float(entry.factor or 1.0)
        composed = bool(entry.params.get("compose") and shipped_context)
        context = shipped_context if composed and shipped_context else original_context
        if factor > 1 and length > factor * context:
            need = math.ceil(length / context)
            start = f" from the shipped context {context}" if composed else ""
            raise SuiteError(
                f"factor {factor:g} of '{entry.label}' is too small for {task} at {length} tokens "
                f"(extended context {int(factor * context)}{start}); use factor >= {need}"
                + (" or --shipped-context N where the checkpoint serves more" if start else "")
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


__all__ = ["Contexts", "Resolved", "check_lengths", "contexts_of", "is_relative", "positive_ints", "prepare"]
