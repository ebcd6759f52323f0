"""Refusing KV caches that attention-level modes cannot read correctly.

The modes keep keys unrotated in the cache and give every cached key j the position
``first query position − (kv − q − j)`` (:func:`ropescale.attention.rotate_on_read.key_positions`): the
cache must hold exactly the keys seen so far, in order, as transformers' ``DynamicCache`` (and its
sliding-window layers) does. A static cache (``cache_implementation="static"``, a ``StaticCache``
passed in) returns its whole preallocated buffer, so keys would be rotated at the wrong positions
and generation would run and be wrong. A forward pre-hook on the decoder refuses it instead. The
same hook checks the rotated keys kept beside the cache (:func:`.rotated_cache.observe`).
"""

from __future__ import annotations

from typing import Any

from ..errors import RopescaleError
from .rotated_cache import observe


class UnsupportedCacheError(RopescaleError, ValueError):
    """A KV cache whose layout an attention-level mode cannot read (a static cache)."""


def unsupported_layers(cache: Any) -> list[str]:
    """Names of the cache's layer types that do not keep keys in arrival order (empty when all do)."""
    from transformers.cache_utils import DynamicLayer

    layers = list(getattr(cache, "layers", None) or [])
    kinds = [type(layer) for layer in layers]
    replicate = getattr(cache, "layer_class_to_replicate", None)
    if replicate is not None:
        kinds.append(replicate)
    return sorted({kind.__name__ for kind in kinds if not issubclass(kind, DynamicLayer)})


def check_cache(rotary: Any, cache: Any) -> None:
    """Raise :class:`UnsupportedCacheError` if ``cache`` cannot serve ``rotary``'s mode."""
    if cache is None or not hasattr(cache, "layers"):
        return
    bad = unsupported_layers(cache)
    if bad:
        what = "Self-Extend" if rotary.mode == "self_extend" else "the KV-consistent mode"
        other = "" if rotary.mode == "self_extend" else ", or patch with kv_consistent=false"
        raise UnsupportedCacheError(
            f"{what} needs a KV cache that holds the keys seen so far in order; {type(cache).__name__} "
            f"({', '.join(bad)}) does not: use the default dynamic cache (no cache_implementation='static', "
            f"no StaticCache){other}"
        )


def install_hook(owner: Any, rotary: Any) -> Any:
    """Check the KV cache of every forward call of ``owner`` (the decoder: ``cache``, before
    transformers 5.24 ``past_key_values``); returns a handle whose ``remove()`` removes the hooks.

    After the call (even a failed one) the cache is forgotten, so attention run outside the
    decoder's forward never reads rotated keys the pre-hook did not vouch for.
    """

    def hook(module: Any, args: tuple, kwargs: dict) -> None:
        config = rotary._config
        if config is not None and config._attn_implementation != rotary.attention_name:
            rotary._rotated_cache = None
            return  # attention switched away (S²-Attn, set_attn_implementation): the layers rotate again
        cache = kwargs.get("cache", kwargs.get("past_key_values"))  # transformers >= 5.24 calls it `cache`
        if cache is None:
            cache = next((a for a in args if hasattr(a, "layers") and hasattr(a, "get_seq_length")), None)
        check_cache(rotary, cache)
        observe(rotary, cache)  # rotated keys kept beside the cache: vouched for, or dropped if stale

    def forget(module: Any, args: tuple, kwargs: dict, output: Any) -> None:
        rotary._rotated_cache = None

    return _Handles(
        owner.register_forward_pre_hook(hook, with_kwargs=True),
        owner.register_forward_hook(forget, with_kwargs=True, always_call=True),
    )


class _Handles:
    """Several hook handles removed as one."""

    def __init__(self, *handles: Any):
        self.handles = handles

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


__all__ = ["UnsupportedCacheError", "check_cache", "install_hook", "unsupported_layers"]
