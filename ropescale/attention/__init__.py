"""Attention-level modes, installed through transformers' attention interface.

* ``kv_consistent`` (:mod:`.consistent`): methods whose frequencies follow the current length
  (dynamic methods, LongRoPE's switch at L) rotate every cached key with the current frequencies,
  so cached generation equals recomputation. On by default for them;
  ``patch(..., kv_consistent=False)`` (CLI ``--param kv_consistent=false``) gives transformers'
  behaviour.
* ``self_extend`` (:mod:`.self_extend`): Self-Extend grouped attention, the ``self_extend`` method.
* ``dca`` (:mod:`.dca`): Dual Chunk Attention, the ``dca`` method.
* ``string`` (:mod:`.string`): STRING's shifted positions, the ``string`` method.
* ``self_extend_llamacpp`` (:mod:`.self_extend_llamacpp`): llama.cpp's grouped-KV Self-Extend.

On a checkpoint that ships a scaling (Llama 3.1's llama3, a YaRN Qwen) a mode composed on it
(:class:`~ropescale.methods.composed.Composed`) rotates with the shipped frequencies and attention
factor, and measures its sizes in the shipped context (:func:`attention_target`).

Both keep keys unrotated in the KV cache (:mod:`.rotary`). Installing one swaps the model's rotary
module for an :class:`~.rotary.AttentionRotary`, points every attention layer at it and sets
``config._attn_implementation`` to the mode's registered name; removing it restores the model's
own implementation. Only the default ``DynamicCache`` (and its sliding-window layers) is
supported: a static cache does not keep keys in position order, and is refused in one line
(:mod:`.cache_guard`) rather than giving wrong results.

Each mode is a row of :mod:`.modes` (torch-free: the command line reads it) and its kernel a row
of :mod:`.kernels` (imported there, never looked up by module name).
"""

from __future__ import annotations

import warnings
from typing import Any

from .modes import MODES


def install(model: Any, owner: Any, plan: Any, mode: str, device: Any = None) -> Any:
    """Install ``mode`` for ``plan`` on ``model`` (whose decoder is ``owner``); returns the rotary module.

    The caller (:func:`ropescale.patching.model.install_rotary`) assigns it to ``owner.rotary_emb``.
    """
    from . import cache_guard, consistent
    from .kernels import kernel as kernel_of
    from .rotate_on_read import LAYER_ATTR, AttentionRotary

    kernel = kernel_of(mode)  # unknown modes: one line naming the known ones
    row = kernel.mode
    requested = model.config._attn_implementation or "sdpa"
    inner = kernel_for(mode, requested)
    if inner != requested and requested not in consistent.NAMES:
        warnings.warn(
            f"{mode} runs on sdpa or eager attention; using {inner} instead of {requested!r} "
            "(restored when the mode is removed)",
            stacklevel=3,
        )
    native = model.config if plan.native and plan.method.varies_with_length() else None
    method, spec = attention_target(plan.method, plan.spec)
    rotary = AttentionRotary(method, spec, mode, inner, device=device, native_config=native)
    if method is not plan.method:  # composed on the shipped scaling: its frequencies and attention factor
        rotary.pin_frequencies(*plan.method.compute(plan.spec, None, device))
    rotary.restore = requested  # the user's kernel, given back by uninstall
    for attr, value in row.settings(method, spec).items():
        setattr(rotary, attr, value)
    kernel.register()
    name = kernel.name(inner)
    if getattr(method, "logn", False):
        rotary.logn_context = spec.original_max_position_embeddings
    for layer in _attention_layers(owner):
        layer.__dict__[LAYER_ATTR] = rotary  # a plain reference, not a submodule
    _set_implementation(model, name)
    rotary._config, rotary.attention_name = model.config, name  # switched away later: layers rotate again
    rotary._cache_hook = cache_guard.install_hook(owner, rotary)  # a static cache is refused, not misread
    return rotary


def attention_target(method: Any, spec: Any) -> tuple[Any, Any]:
    """The attention-level method a mode runs and the geometry its sizes are measured in.

    A method alone: itself and the model's original geometry. Composed on a shipped scaling
    (:meth:`~ropescale.methods.composed.Composed.attention_view`): the second method, measured from the
    shipped context L_s (its window, group, chunk, shift; its logn and temperature context), while the
    frequencies it rotates with are the composition's (the shipped ones, pinned by :func:`install`).
    """
    view = getattr(method, "attention_view", None)
    return view(spec) if view is not None and method.attention else (method, spec)


def uninstall(model: Any, owner: Any) -> None:
    """Remove an installed mode (if any): restore the model's own attention implementation."""
    from .rotate_on_read import LAYER_ATTR, AttentionRotary

    rotary = getattr(owner, "rotary_emb", None)
    if not isinstance(rotary, AttentionRotary):
        return
    for layer in _attention_layers(owner):
        layer.__dict__.pop(LAYER_ATTR, None)
    hook = getattr(rotary, "_cache_hook", None)
    if hook is not None:
        hook.remove()
    _set_implementation(model, getattr(rotary, "restore", rotary.inner))


def kernel_for(mode: str | None, requested: str) -> str:
    """The attention kernel that runs when ``mode`` is installed on a model asked to run ``requested``.

    The KV-consistent mode wraps SDPA or eager (flash-attn and other kernels cannot take rotated
    cached keys from it: SDPA runs instead); Self-Extend, DCA and STRING always run torch's SDPA
    kernels that return the log-sum-exp (:mod:`.merge`), recorded as ``sdpa``; without a mode, the
    requested kernel runs.
    """
    from .consistent import NAMES

    if mode is None:
        return requested
    return requested if mode == "kv_consistent" and requested in NAMES else "sdpa"


def _attention_layers(owner: Any) -> list[Any]:
    layers = [getattr(layer, "self_attn", None) for layer in getattr(owner, "layers", [])]
    if not layers or any(layer is None for layer in layers):
        raise RuntimeError(f"cannot find the attention layers of {type(owner).__name__}")
    return layers


def _set_implementation(model: Any, name: str) -> None:
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(name)
    else:
        model.config._attn_implementation = name


__all__ = ["MODES", "attention_target", "install", "kernel_for", "uninstall"]
