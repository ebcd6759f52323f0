"""Keys of one ``config.json`` that say the same thing twice and disagree.

A checkpoint may carry its RoPE scaling in two places: transformers 5's ``rope_parameters`` and the
legacy ``rope_scaling`` with top-level ``rope_theta``, ``partial_rotary_factor`` and
``original_max_position_embeddings`` (what transformers 4 and the serving engines read; ropescale
writes both, equal). When the two disagree, each reader silently takes a different model:

* transformers 5 (``convert_rope_params_to_dict`` / ``standardize_rope_params``, read in 5.24)
  takes ``rope_scaling`` whole when it is set, fills ``rope_theta`` and ``partial_rotary_factor``
  from the top level only where the dict lacks them, and for llama3/yarn/longrope overwrites the
  dict's ``original_max_position_embeddings`` with a top-level one;
* transformers 4, vLLM <= 0.11, SGLang and TGI read ``rope_scaling`` and the top-level keys;
* ``ropescale doctor`` and the llama.cpp converter read ``rope_parameters``.

So a config whose ``rope_parameters`` says yarn x4 and whose ``rope_scaling`` says linear x2 was
evaluated as linear x2 while ``doctor`` reported yarn. Neither reading is "the right one", so
:func:`check_agreement` refuses the config in one line naming both keys and values; the user
removes the stale one (or re-saves with ropescale, which writes both from one source). Keys that
agree, or are set in one place only, pass.
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import RopescaleError

_MISSING = "(missing)"


class ConfigError(RopescaleError):
    """A model config that transformers would reject, or that ropescale would misread."""

    def __init__(self, source: str, key: str, value: Any, problem: str):
        shown = value if value is _MISSING else repr(value)
        super().__init__(f"{source}: {key} = {shown}: {problem}")
        self.source, self.key, self.value, self.problem = source, key, value, problem


#: rope types for which transformers 5 takes a top-level original_max_position_embeddings over the dict's
_TOP_LEVEL_ORIGINAL = ("llama3", "yarn", "longrope")
#: the base transformers and the engines take when no rope_theta is written (Llama, Mistral, Qwen2, Qwen3)
_DEFAULT_THETA = 10000.0
#: keys that describe the scaling's meaning; legacy-only spellings (``type``, ``attn_factor``) are not compared
_SKIP = frozenset({"type", "attn_factor"})


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _flat(value: Any) -> dict[str, Any] | None:
    """A flat rope dict, or None (absent, not a dict, or nested per layer type: not compared)."""
    if not isinstance(value, dict) or not value or all(isinstance(v, dict) for v in value.values()):
        return None
    return value


def _rope_type(rope: dict[str, Any]) -> Any:
    return rope.get("rope_type", rope.get("type", "default"))


def _conflict(source: str, key_a: str, a: Any, key_b: str, b: Any, why: str) -> Exception:
    error = ConfigError(source, key_a, a, why)
    error.args = (f"{source}: {key_a} = {a!r} but {key_b} = {b!r}: {why}; make them equal or remove one",)
    return error


def check_agreement(data: dict[str, Any], source: str) -> None:
    """Refuse a config whose duplicated RoPE keys disagree (see the module docstring).

    Args:
        data: the parsed config.json (ropescale's marking already unwrapped).
        source: the file, for the message.

    Raises:
        ConfigError: ``<file>: <key> = <value> but <other key> = <value>: <who reads which>; make them
            equal or remove one``.
    """
    params = _flat(data.get("rope_parameters"))
    scaling = _flat(data.get("rope_scaling"))
    for key, rope in (("rope_parameters", params), ("rope_scaling", scaling)):
        if rope is not None and "type" in rope and "rope_type" in rope and not _same(rope["type"], rope["rope_type"]):
            raise _conflict(
                source,
                f"{key}.rope_type",
                rope["rope_type"],
                f"{key}.type",
                rope["type"],
                "transformers reads rope_type, vLLM <= 0.11, TGI and older llama.cpp converters read type",
            )
    if params is not None and scaling is not None:
        a, b = _rope_type(params), _rope_type(scaling)
        if not _same(a, b):
            raise _conflict(
                source,
                "rope_parameters.rope_type",
                a,
                "rope_scaling.rope_type",
                b,
                "transformers 5 and the serving engines load rope_scaling, llama.cpp's converter reads rope_parameters",
            )
        for key in sorted((set(params) & set(scaling)) - _SKIP - {"rope_type"}):
            if not _same(params[key], scaling[key]):
                raise _conflict(
                    source,
                    f"rope_parameters.{key}",
                    params[key],
                    f"rope_scaling.{key}",
                    scaling[key],
                    "transformers 5 and the serving engines load rope_scaling, llama.cpp's converter reads "
                    "rope_parameters",
                )
        if "rope_theta" in params and "rope_theta" not in scaling and data.get("rope_theta") is None:
            if not _same(params["rope_theta"], _DEFAULT_THETA):
                raise _conflict(
                    source,
                    "rope_parameters.rope_theta",
                    params["rope_theta"],
                    "rope_scaling.rope_theta (absent, so transformers' default)",
                    _DEFAULT_THETA,
                    "transformers 5 and the serving engines load rope_scaling and the top-level rope_theta",
                )
    for rope_key, rope in (("rope_parameters", params), ("rope_scaling", scaling)):
        if rope is None:
            continue
        for key, readers in (
            ("rope_theta", "transformers 4 and the serving engines read the top-level key"),
            ("partial_rotary_factor", "transformers 4 and the serving engines read the top-level key"),
        ):
            if key in rope and data.get(key) is not None and not _same(rope[key], data[key]):
                raise _conflict(source, f"{rope_key}.{key}", rope[key], key, data[key], readers)
        top = data.get("original_max_position_embeddings")
        inner = rope.get("original_max_position_embeddings")
        if _rope_type(rope) in _TOP_LEVEL_ORIGINAL and top is not None and inner is not None and not _same(top, inner):
            raise _conflict(
                source,
                f"{rope_key}.original_max_position_embeddings",
                inner,
                "original_max_position_embeddings",
                top,
                "transformers 5, vLLM and SGLang take the top-level one",
            )
    _check_context_order(data, params or scaling, "rope_parameters" if params else "rope_scaling", source)


def _check_context_order(data: dict[str, Any], rope: dict[str, Any] | None, rope_key: str, source: str) -> None:
    """The extended context (``max_position_embeddings``) below the trained one
    (``original_max_position_embeddings``) of a scaled checkpoint: one of them is wrong, and
    ropescale, vLLM and transformers would each take a different one as the trained context."""
    if rope is None or _rope_type(rope) not in _TOP_LEVEL_ORIGINAL:
        return
    original = data.get("original_max_position_embeddings", rope.get("original_max_position_embeddings"))
    extended = data.get("max_position_embeddings")
    numbers = all(isinstance(v, int) and not isinstance(v, bool) for v in (original, extended))
    if numbers and extended < original:
        key = (
            "original_max_position_embeddings"
            if "original_max_position_embeddings" in data
            else f"{rope_key}.original_max_position_embeddings"
        )
        error = ConfigError(source, "max_position_embeddings", extended, "")
        error.args = (
            f"{source}: max_position_embeddings = {extended} is below {key} = {original}: a scaled "
            f"checkpoint's context cannot be shorter than the one it was trained on; correct one of them",
        )
        raise error


__all__ = ["check_agreement"]
