"""The registry itself: names to method classes, with strict registration and "did you mean" lookups.

It lives apart from the package's ``__init__`` (which registers the methods) so that a method built from
other methods by name (:class:`ropescale.methods.composed.Composed`) can look them up without importing
the package that imports it.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from typing import Any

from .base import ScalingMethod

METHODS: dict[str, type[ScalingMethod]] = {}

# Names users reach for that mean one of ours (transformers' and the papers' spellings).
ALIASES = {"none": "default", "pi": "linear", "dynamic": "dynamic_ntk", "ntk_aware": "ntk"}


def register_method(cls: type[ScalingMethod]) -> type[ScalingMethod]:
    """Add a method class to the registry; rejects malformed or duplicate names."""
    name = getattr(cls, "name", "")
    if not isinstance(name, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise ValueError(f"method name must be lower_snake_case, got {name!r}")
    if name in METHODS or name in ALIASES:
        raise ValueError(f"method {name!r} is already registered")
    if not (isinstance(cls, type) and issubclass(cls, ScalingMethod)):
        raise TypeError(f"{cls!r} is not a ScalingMethod subclass")
    METHODS[name] = cls
    return cls


def method_class(name: str) -> type[ScalingMethod]:
    """The class registered under ``name`` (or an alias); unknown names list the known ones."""
    key = str(name).strip().lower().replace("-", "_")
    key = ALIASES.get(key, key)
    if key in METHODS:
        return METHODS[key]
    known = sorted(METHODS)
    close = difflib.get_close_matches(key, known + sorted(ALIASES), n=1)
    hint = f"; did you mean {ALIASES.get(close[0], close[0])!r}?" if close else ""
    raise ValueError(f"unknown method {name!r}{hint} Known methods: {', '.join(known)}")


def check_parameter_names(cls: type[ScalingMethod], names: Iterable[str]) -> None:
    """Refuse a parameter ``cls`` does not have, naming it and the ones it has (the values are the
    method's own to check, when it is built)."""
    known = cls.parameter_defaults()
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise ValueError(
            f"unknown parameter {unknown[0]!r} for method {cls.name!r}; its parameters: {', '.join(known)}"
        )


def get_method(name: str, **params: Any) -> ScalingMethod:
    """Build a validated method instance, e.g. ``get_method("yarn", factor=8, beta_fast=32)``."""
    cls = method_class(name)
    check_parameter_names(cls, params)
    return cls(**params)
