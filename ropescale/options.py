"""Typed values from text: the one set of parsers the command line and the lm-eval model share.

Command-line flags (argparse ``type=``, through :func:`ropescale.cli.common.typed`) and lm-eval's
``--model_args`` (which reach the ``ropescale`` lm-eval model as strings whenever lm-eval could not
type them) are read by the same functions, so a value means the same thing, and is refused with the
same one-line message, wherever it is given. Each parser also accepts an already typed value (an
``int`` for :func:`positive_int`...), so typing twice is harmless.

Every parser raises ``ValueError`` naming the value it was given; ``name`` says what the value is
for (``factor``, ``--max-length``...).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import MISSING, field, fields
from typing import Any

#: texts read as "no value" by :func:`none_like`
NONE_TEXTS = ("", "none")
_TRUE = ("true", "1", "yes")
_FALSE = ("false", "0", "no", "")


def none_like(value: Any) -> bool:
    """Whether ``value`` means "not given": None, ``""`` or ``"none"`` (any case, spaces ignored)."""
    return value is None or (isinstance(value, str) and value.strip().lower() in NONE_TEXTS)


def positive_int(value: Any, name: str | None = None) -> int:
    """A positive integer from ``value`` (a string like ``" 8192 "``, an int, or a whole float).

    Args:
        value: the value to read; bools are refused.
        name: what the value is for, used in the message (none: "expected a positive integer").

    Returns:
        The integer.

    Raises:
        ValueError: not a whole number, or not positive.
    """
    what = f"{name} must be a positive integer" if name else "expected a positive integer"
    if isinstance(value, bool):
        raise ValueError(f"{what}, got {value!r}")
    try:
        number = int(value.strip()) if isinstance(value, str) else int(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{what}, got {value!r}") from None
    if number <= 0 or (isinstance(value, float) and number != value):
        raise ValueError(f"{what}, got {value!r}")
    return number


def positive_ints(value: Any, name: str | None = None) -> list[int]:
    """Positive integers from a comma-separated text (``"2048,8192"``) or a list.

    Raises:
        ValueError: no values, or one that is not a positive integer.
    """
    items = value.split(",") if isinstance(value, str) else list(value)
    items = [v for v in items if not (isinstance(v, str) and not v.strip())]
    what = name or "value"
    if not items:
        raise ValueError(f"{what} must be comma-separated positive integers, got {value!r}")
    try:
        return [positive_int(v) for v in items]
    except ValueError:
        raise ValueError(f"{what} must be comma-separated positive integers, got {value!r}") from None


#: the suffix of a length in thousands of tokens: 1k = 1024 (as the docs write 4k, 32k, 128k)
KILO = 1024


def length(value: Any, name: str | None = None) -> int:
    """A length in tokens: a positive integer, or a number of k with ``k``/``K`` = 1024 (``"32k"`` → 32768,
    ``"1.5k"`` → 1536), the way the docs and model cards write lengths. The one parser of every
    length-like flag (``--lengths``, ``--target-length``, ``--max-tokens``, ``--stride``...) and of the
    lengths of a suite file.

    Raises:
        ValueError: not a whole number of tokens, or not positive.
    """
    what = f"{name} must be a positive integer or a number of k (1k = 1024)" if name else None
    if isinstance(value, str) and value.strip()[-1:] in ("k", "K"):
        text = value.strip()[:-1].strip()
        try:
            number = float(text) * KILO
        except ValueError:
            number = math.nan
        if not text or not math.isfinite(number) or number <= 0 or number != int(number):
            raise ValueError(f"{what or 'expected a positive integer or a number of k (1k = 1024)'}, got {value!r}")
        return int(number)
    try:
        return positive_int(value, name)
    except ValueError:
        raise ValueError(
            f"{what or 'expected a positive integer or a number of k (1k = 1024)'}, got {value!r}"
        ) from None


def lengths(value: Any, name: str | None = None) -> list[int]:
    """Lengths from a comma-separated text (``"4k,32k"``, ``"2048,8192"``) or a list (see :func:`length`).

    Raises:
        ValueError: no values, one that is not a length, or one given twice (``64,64``, ``4k,4096``).
    """
    items = value.split(",") if isinstance(value, str) else list(value)
    items = [v for v in items if not (isinstance(v, str) and not v.strip())]
    what = name or "value"
    if not items:
        raise ValueError(f"{what} must be comma-separated lengths (4096 or 4k), got {value!r}")
    try:
        found = [length(v) for v in items]
    except ValueError:
        raise ValueError(
            f"{what} must be comma-separated lengths (positive integers, or 4k = 4096), got {value!r}"
        ) from None
    twice = next((n for i, n in enumerate(found) if n in found[:i]), None)
    if twice is not None:  # one cell per length: a repeat was a report column measured once, shown twice
        raise ValueError(f"{what} gives {twice} twice ({value!r}); give each length once")
    return found


def factor(value: Any, name: str = "factor") -> float:
    """A scaling factor: a finite number > 0, as a float.

    The range each method accepts (most need ≥ 1) is the method's own check; this one only makes
    sure a number reaches it.

    Raises:
        ValueError: not a number (``"factor must be a number, got 'abc'"``), not finite, or ≤ 0.
    """
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number, got {value!r}")
    try:
        number = float(value.strip()) if isinstance(value, str) else float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if number <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return number


def boolean(value: Any, name: str = "value") -> bool:
    """``true/1/yes`` → True, ``false/0/no/""`` → False (any case); bools and the ints 0/1 as they are.

    Raises:
        ValueError: anything else.
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE:
        return True
    if isinstance(value, str) and value.strip().lower() in _FALSE:
        return False
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ValueError(f"{name} must be true or false, got {value!r}")


def sliding_window(value: Any, name: str = "sliding_window") -> str | int | None:
    """A Mistral-style sliding window setting: ``"keep"``, None (``none``: full attention) or a width.

    Raises:
        ValueError: anything else (``"sliding_window must be keep, none or a positive integer, ..."``).
    """
    if isinstance(value, str) and value.strip().lower() == "keep":
        return "keep"
    if none_like(value):
        return None
    try:
        return positive_int(value)
    except ValueError:
        raise ValueError(f"{name} must be keep, none or a positive integer, got {value!r}") from None


def param_value(value: Any) -> Any:
    """A method parameter's value read as YAML (``32`` → 32, ``[1,2]`` → [1, 2], ``1.0e+4`` → 10000.0);
    text YAML cannot read stays text, and values that are not strings are returned as they are."""
    if not isinstance(value, str):
        return value
    import yaml

    try:
        return yaml.safe_load(value)
    except yaml.YAMLError:
        return value


def key_values(items: Iterable[str], flag: str = "--param", allow_json: bool = False) -> dict[str, Any]:
    """``["beta_fast=32", "long_factor=[1,2]"]`` → ``{"beta_fast": 32, "long_factor": [1, 2]}``.

    Args:
        items: ``KEY=VALUE`` texts; values are read by :func:`param_value`; a later key wins.
        flag: the flag the items came from, named in the message.
        allow_json: also accept items that are one JSON object (``'{"max_seq_lengths": [4096]}'``).

    Returns:
        The mapping.

    Raises:
        ValueError: an item without ``=`` or a key, or (``allow_json``) invalid JSON.
    """
    out: dict[str, Any] = {}
    expects = "KEY=VALUE or a JSON object" if allow_json else "KEY=VALUE"
    for item in items:
        text = item.strip()
        if allow_json and text.startswith("{"):
            try:
                value = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{flag}: invalid JSON: {exc.msg}") from None
            if not isinstance(value, dict):
                raise ValueError(f"{flag}: expected a JSON object")
            out.update(value)
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{flag} expects {expects}, got {item!r}")
        out[key.strip()] = param_value(value)
    return out


# -- options dataclasses that drive argparse ------------------------------------------------------
# One dataclass per command holds each option once: its default, its type and, in the field's
# metadata, its help and how the command line spells it. :func:`option` writes that metadata,
# :func:`add_arguments` turns the fields into flags, :func:`from_arguments` builds the dataclass back.


def option(default: Any = MISSING, help: str = "", **cli: Any) -> Any:
    """A dataclass field with its command-line flag: ``help`` and, in ``cli``, argparse's ``choices``,
    ``metavar``, ``type``, ``required``; ``flag`` (default ``--field-name``), ``dest`` (default the field's
    name), ``cli_default`` (the flag's default as typed, where it differs from the field's), ``parse``
    (flag value -> field value) and ``suite`` (what a suite file's reader needs, not argparse)."""
    kwargs = {"default": default} if default is not MISSING else {}
    if isinstance(default, (list, dict, set)):
        raise TypeError("mutable option defaults: use a tuple")
    return field(metadata={"help": help, **cli}, **kwargs)


def add_arguments(parser: Any, cls: type, skip: Iterable[str] = ()) -> None:
    """One argparse flag per field of ``cls`` that has :func:`option` metadata (except ``skip``)."""
    for f in fields(cls):
        meta = dict(f.metadata)
        if "help" not in meta or f.name in skip:
            continue
        flag = meta.pop("flag", "--" + f.name.replace("_", "-"))
        dest = meta.pop("dest", f.name)
        meta.pop("parse", None)
        meta.pop("suite", None)
        default = meta.pop("cli_default", None if f.default is MISSING else f.default)
        if meta.pop("switch", False):
            parser.add_argument(flag, dest=dest, action="store_true", help=meta["help"])
            continue
        if f.default is MISSING:
            meta["required"] = True
        parser.add_argument(flag, dest=dest, default=default, **meta)


def from_arguments(cls: type, args: Any, **overrides: Any) -> Any:
    """``cls`` built from parsed ``args``: every field found there (through its ``parse``), then ``overrides``."""
    values = {}
    for f in fields(cls):
        dest = f.metadata.get("dest", f.name)
        if f.name in overrides or not hasattr(args, dest):
            continue
        parse = f.metadata.get("parse")
        value = getattr(args, dest)
        values[f.name] = parse(value) if parse else value
    return cls(**{**values, **overrides})
