"""Choosing the factor from the context you want: ``target_length`` → ``factor``.

The rule, per method (the method's registered name decides, aliases included):

- every scaling method: s = N / L exactly (N the target length, L the trained context), so the
  extended context round(s·L) is exactly N. The formulas of linear, ntk, dynamic_ntk, yarn,
  dynamic_yarn and longrope are continuous in s, and transformers accepts any float factor.
- ``llama3``: s = ceil(N / L), an integer, as Meta ships it (8 for Llama 3.1, 32 for Llama 3.2);
  the extended context is then ≥ N.
- ``default`` (plain RoPE) has no factor: a target length is refused.

N must be > L: a model already covers lengths up to the context it was trained at, and s < 1
would compress positions below what the model has seen, which no method means.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from .base import ScalingMethod

#: Methods whose factor is rounded up to a whole number (the form their reference checkpoints use).
INTEGER_FACTOR_METHODS = frozenset({"llama3"})


def _method_name(method: str | ScalingMethod | type[ScalingMethod]) -> str:
    from . import method_class

    if isinstance(method, ScalingMethod) or (isinstance(method, type) and issubclass(method, ScalingMethod)):
        return method.name
    return method_class(method).name  # unknown names raise with the list of known ones


def factor_for_target(
    method: str | ScalingMethod | type[ScalingMethod], target_length: int, original_context: int
) -> float:
    """The factor ``method`` needs to reach ``target_length`` from ``original_context``.

    Args:
        method: a method name (or alias), class or instance.
        target_length: the context N to reach, in tokens (> ``original_context``).
        original_context: the context L the model was trained at.

    Returns:
        N / L, or ceil(N / L) for methods in :data:`INTEGER_FACTOR_METHODS`; always > 1.

    Raises:
        ValueError: unknown method, ``default``, a non-integer length, or N ≤ L.
    """
    name = _method_name(method)
    for label, value in (("target_length", target_length), ("original context", original_context)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
            raise ValueError(f"{label} must be a positive integer, got {value!r}")
    if name == "default":
        raise ValueError("method 'default' (plain RoPE) does not scale; a target length needs a scaling method")
    if target_length <= original_context:
        raise ValueError(
            f"target length {target_length} is not beyond the model's trained context {original_context}: "
            "no scaling is needed up to that length (use the model as it is)"
        )
    ratio = int(target_length) / int(original_context)
    return float(math.ceil(ratio)) if name in INTEGER_FACTOR_METHODS else ratio


def resolve_factor(
    method: str | ScalingMethod | type[ScalingMethod],
    factor: Any = None,
    target_length: int | None = None,
    original_context: int | None = None,
) -> Any:
    """``factor`` as given, or the factor that reaches ``target_length`` (see :func:`factor_for_target`).

    Giving both is an error. ``factor`` is passed through unchanged (possibly None, or a string from
    the command line), so the method class keeps validating it.
    """
    if target_length is None:
        return factor
    if factor is not None:
        raise ValueError("give factor or target_length, not both")
    if original_context is None:
        raise ValueError("target_length needs the model's original context")
    return factor_for_target(method, target_length, original_context)


__all__ = ["INTEGER_FACTOR_METHODS", "factor_for_target", "resolve_factor"]
