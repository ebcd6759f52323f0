"""A Mistral-style sliding window as a patch leaves it: kept (with a warning where it is narrower than the
new context), removed, or set to a width.

A longer context is wasted where attention stays local to a narrower window, and Qwen2/Qwen3 choose each
layer's mask by ``layer_types``, so "no sliding window" has to reach those too; what a setting cannot do
on a model is said in one line before anything is written (:func:`apply_sliding_window`).
"""

from __future__ import annotations

import contextlib
import contextvars
import warnings
from collections.abc import Iterator
from typing import Any

from ..errors import RopescaleError
from ..scaling import KEEP

#: how the sliding-window warning names the setting: the caller's own (train: its recipe key)
_SLIDING_WINDOW_SETTING: contextvars.ContextVar[str] = contextvars.ContextVar(
    "sliding_window_setting", default="Pass sliding_window=None (CLI: --sliding-window none)"
)


@contextlib.contextmanager
def sliding_window_setting(text: str) -> Iterator[None]:
    """Within the block, the sliding-window warning tells the user ``text`` (e.g. ``Set
    model.sliding_window=null``) rather than the patch flag, which a training recipe does not have."""
    token = _SLIDING_WINDOW_SETTING.set(text)
    try:
        yield
    finally:
        _SLIDING_WINDOW_SETTING.reset(token)


def apply_sliding_window(config: Any, extended: int, sliding_window: Any) -> None:
    """Mistral-style sliding window: keep it (warning if it is narrower than the new context),
    remove it (``None``) or set a width."""
    if sliding_window == KEEP:
        window = getattr(config, "sliding_window", None)
        if window is not None and window < extended:
            warnings.warn(
                f"sliding_window={window} is smaller than the extended context {extended}: attention stays local "
                f"to {window} tokens. {_SLIDING_WINDOW_SETTING.get()} to attend over the whole context, or a "
                "number to widen it.",
                stacklevel=3,
            )
        return
    if sliding_window is not None and (
        isinstance(sliding_window, bool) or not isinstance(sliding_window, int) or sliding_window <= 0
    ):
        raise ValueError(f"sliding_window must be 'keep', None or a positive integer, got {sliding_window!r}")
    if not hasattr(config, "sliding_window"):
        raise RopescaleError(f"model type '{config.model_type}' has no sliding_window to change")
    layers = getattr(config, "layer_types", None)
    if sliding_window is None and layers and "sliding_attention" in layers:
        # Qwen2/Qwen3 pick each layer's mask by layer_types: a null width with sliding layers cannot be
        # built, so "no sliding window" makes those layers full (as use_sliding_window=false would)
        config.layer_types = ["full_attention"] * len(layers)
        if hasattr(config, "use_sliding_window"):
            config.use_sliding_window = False
    elif sliding_window is not None and getattr(config, "use_sliding_window", True) is False:
        raise RopescaleError(
            f"use_sliding_window = false: {config.model_type} attends over the whole context in every layer "
            f"(layer_types), so sliding_window = {sliding_window} would be ignored by every loader; leave "
            "--sliding-window out (or set use_sliding_window and layer_types in config.json)"
        )
    config.sliding_window = sliding_window
