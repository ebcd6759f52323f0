"""Rotated keys kept beside the KV cache, so that a decoding step rotates only its new keys.

In an attention-level mode the KV cache holds keys before rotation (:mod:`.rotary`), and each
region reads them rotated at positions that depend on the key's own index j only: Self-Extend's
far keys at j // G and its neighbours at j, DCA's keys at j mod s, STRING's keys at j. A key's
rotated form in a region therefore never changes once computed. This module keeps, per cache
layer, one buffer of rotated keys per region, extended by the keys appended since the last call;
the kernels read it instead of rotating the whole cache at every step (a decoding step rotates
its query and one key per region). The values are the very ones the kernels computed before: the
same elementwise rotation of the same raw key with the same cos/sin table row.

**Never stale.** The buffers hang on the cache layer object (transformers' ``DynamicLayer``), so a
new cache (a new ``generate()``) starts without them. They hold the rotation of the raw keys
[0, m) that the layer held when they were last extended, and are read only when the layer's raw
keys are still those keys with others appended after them. That is proved without reading a key:

* the decoder's forward pre-hook (:func:`observe`, from :mod:`.cache_guard`) compares every
  layer's key tensor with the one the attention function last read: the very same tensor object
  with the same in-place version counter (``Tensor._version``). transformers replaces the tensor
  whenever the cache changes other than by appending (``DynamicLayer.update`` concatenates into a
  new tensor; ``crop`` slices; ``reorder_cache``, ``batch_select_indices`` and
  ``batch_repeat_interleave`` index; ``reset`` drops it; offloading moves it), and an in-place
  write bumps the version (tensors made under ``torch.inference_mode`` keep no version: there
  identity alone, and transformers' dynamic cache never writes into its key tensors in place). A
  crop is recognised exactly (a view of the same tensor starting at its first element, same
  strides, fewer positions) and truncates the buffers; anything else drops them.
* the attention function (:func:`lookup`) reads a layer's buffers only if the pre-hook vouched for
  them in this very forward pass, and the key tensor it receives *is* that layer's tensor (so it
  reads this cache, and ``update`` appended to the vouched-for keys), of a plain ``DynamicLayer``.
  The vouching is used up by the call, and the decoder's forward hook forgets the cache after the
  pass (even a failed one), so attention run outside a forward pass reads none. The rotary module, its parameters and its frequencies'
  length must be those the buffers were built with. Otherwise the kernel rotates as it always did
  (starting new buffers when the cache is known).

Why identity rather than the alternatives: a fingerprint of the last few raw keys costs reads and
can be fooled (beams share their prompt, and layer 0's unrotated keys depend on the token only, so
two beams ending in the same tokens look alike); wrapping each cache layer's ``update`` would patch
transformers' objects. Identity costs nothing, and a copied or pickled cache (``copy.deepcopy`` of
a prompt's cache) simply starts without buffers. Beam search reorders the cache at every step, so
there the buffers are rebuilt every step: as fast as without them, not faster. Padded batches and
chunked prefill take the kernels' masked paths, which rotate the keys they read as before.

**Memory**: one rotated copy of the cached keys per layer (Self-Extend: its far keys, plus at most
W + max(W, 256) neighbours; DCA and STRING: all keys), i.e. the key half of the KV cache once
more, and up to 1/8 of that while a buffer grows. ``model.model.rotary_emb.rotated_keys = False``
turns them off (every step then rotates the whole cache again). Keys that require grad (training)
are never kept.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

import torch

from .modes import ROTATED_KEY_MODES

#: attribute of a cache layer that holds its :class:`LayerState`
ATTR = "_ropescale_rotated"
#: modes whose kernels read rotated keys from here (their rows in :mod:`.modes`)
MODES = ROTATED_KEY_MODES
_GROW = 256  # rows added at least when a buffer grows

#: ``rotate_rows(a, b)``: the raw keys a..b−1 rotated at the region's positions # [b, h_kv, b − a, d]
Rows = Callable[[int, int], torch.Tensor]


class RotatedKeys:
    """Rows [start, end) of one cache layer's keys rotated at one region's positions.

    Args:
        window: keep only the rows still needed by requests that end ``window`` rows back (a
            region that reads the last ``window`` keys); None keeps every row.
    """

    def __init__(self, window: int | None = None):
        self.window = window
        self.buffer: torch.Tensor | None = None  # [b, h_kv, capacity, d]
        self.start = self.end = 0

    def get(self, key: torch.Tensor, begin: int, end: int, rotate_rows: Rows) -> torch.Tensor:
        """Rows [begin, end) of ``key`` rotated: those held are read, only the others are rotated."""
        buffer = self.buffer
        if buffer is None or not self.start <= begin <= self.end or not _fits(buffer, key):
            rows = rotate_rows(begin, end)
            self._adopt(rows, begin, end)
            return rows
        if end > self.end:
            self._reserve(begin, end)
            self.buffer[:, :, self.end - self.start : end - self.start] = rotate_rows(self.end, end)
            self.end = end
        return self.buffer[:, :, begin - self.start : end - self.start]

    def truncate(self, length: int) -> None:
        """Forget the rows from ``length`` on (the raw cache was cropped to ``length`` keys)."""
        self.end = max(self.start, min(self.end, length))

    def _adopt(self, rows: torch.Tensor, begin: int, end: int) -> None:
        if self.window is not None and end - begin > 2 * self.window:
            rows, begin = rows[:, :, -self.window :].clone(), end - self.window  # the tail is all that is read
        self.buffer, self.start, self.end = rows, begin, end

    def _reserve(self, begin: int, end: int) -> None:
        """Room for rows up to ``end``: a new buffer (the rows still needed copied) when it is full."""
        buffer = self.buffer
        inference = buffer.is_inference() and not torch.is_inference_mode_enabled()  # cannot write into it here
        if end - self.start <= buffer.shape[2] and not inference:
            return
        keep = self.start if self.window is None else begin  # a window drops the rows no request reads again
        held = end - keep
        size = held + max(_GROW, held // 8 if self.window is None else self.window)
        grown = torch.empty((*buffer.shape[:2], size, buffer.shape[3]), dtype=buffer.dtype, device=buffer.device)
        grown[:, :, : self.end - keep] = buffer[:, :, keep - self.start : self.end - self.start]
        self.buffer, self.start = grown, keep


class LayerState:
    """The rotated-key buffers of one cache layer and what they were built from."""

    def __init__(self, rotary: Any, signature: tuple):
        self.rotary = weakref.ref(rotary)
        self.signature = signature
        self.regions: dict[str, RotatedKeys] = {}
        self.source: weakref.ref | None = None  # the raw key tensor the attention function last read
        self.version: int | None = -1  # its in-place version then (None: an inference tensor)
        self.vouched = False  # set by the pre-hook of the current forward pass, used up by one call

    def __getstate__(self) -> dict:
        # a copied or pickled cache (copy.deepcopy of a prompt cache) starts without buffers: its
        # tensors are new objects, which nothing here could vouch for
        return {"signature": self.signature}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, rotary=_gone, regions={}, source=None, version=-1, vouched=False)

    def region(self, name: str, window: int | None = None) -> RotatedKeys:
        """The buffer of region ``name`` (created empty on first use)."""
        if name not in self.regions:
            self.regions[name] = RotatedKeys(window)
        return self.regions[name]

    def vouch(self, keys: Any) -> bool:
        """Whether ``keys`` (the layer's raw keys now) are the keys last read or a crop of them; a crop
        truncates the buffers. Sets :attr:`vouched` to the answer."""
        source = self.source() if self.source is not None else None
        self.vouched = False
        if not isinstance(keys, torch.Tensor) or source is None or _version(keys) != self.version:
            return False
        if keys is not source:
            root = source if source._base is None else source._base
            cropped = (
                keys._base is root
                and keys.data_ptr() == source.data_ptr()
                and keys.stride() == source.stride()
                and keys.dim() == source.dim() == 4
                and keys.shape[:2] == source.shape[:2]
                and keys.shape[3] == source.shape[3]
                and keys.shape[2] <= source.shape[2]
            )
            if not cropped:
                return False
            for region in self.regions.values():
                region.truncate(keys.shape[2])
        self.vouched = True
        return True


def observe(rotary: Any, cache: Any) -> None:
    """Forward pre-hook part: remember this pass's cache, vouch for its layers' buffers or drop them.

    Args:
        rotary: the model's :class:`~.rotary.AttentionRotary`.
        cache: the KV cache the decoder was called with (None: none, or one it creates).
    """
    enabled = bool(getattr(rotary, "rotated_keys", True)) and getattr(rotary, "mode", None) in MODES
    known = enabled and cache is not None and hasattr(cache, "layers")  # its layers may come with the first update
    rotary._rotated_cache = weakref.ref(cache) if known else None
    layers = list(getattr(cache, "layers", None) or [])
    for layer in layers:
        state = getattr(layer, "__dict__", {}).get(ATTR)
        if state is not None and not (enabled and state.vouch(getattr(layer, "keys", None))):
            del layer.__dict__[ATTR]  # stale or unwanted: free it; a later call rebuilds


def lookup(module: Any, rotary: Any, key: torch.Tensor) -> LayerState | None:
    """The buffers an attention call of ``module`` may read and extend, or None (rotate as usual).

    Args:
        module: the attention layer (its ``layer_idx`` names its cache layer).
        rotary: its :class:`~.rotary.AttentionRotary`.
        key: the raw keys the call received (the whole cache).
    """
    ref = getattr(rotary, "_rotated_cache", None)
    cache = ref() if ref is not None else None
    index = getattr(module, "layer_idx", None)
    if cache is None or index is None or key.requires_grad or not getattr(rotary, "rotated_keys", True):
        return None
    layers = cache.layers
    layer = layers[index] if 0 <= index < len(layers) else None
    if type(layer) is not _dynamic_layer() or layer.keys is not key:
        return None  # not this cache's tensor (no cache, sliding or quantized layers): no proof of appending
    signature = _signature(rotary)
    state = layer.__dict__.get(ATTR)
    if state is None or not state.vouched or state.rotary() is not rotary or state.signature != signature:
        state = LayerState(rotary, signature)
        layer.__dict__[ATTR] = state
    state.vouched = False  # one call per vouching: the next forward's pre-hook checks the cache again
    state.source, state.version = weakref.ref(key), _version(key)
    return state


def rotated(
    state: LayerState | None,
    name: str,
    key: torch.Tensor,
    begin: int,
    end: int,
    rotate_rows: Rows,
    window: int | None = None,
) -> torch.Tensor:
    """Keys [begin, end) rotated for region ``name``: from ``state``'s buffer, or rotated now if None.

    Args:
        state: from :func:`lookup`, or None.
        name: the region (one buffer per name and layer).
        key: the raw keys [b, h_kv, kv, d]; ``rotate_rows(a, b)`` rotates rows a..b−1 of it.
        window: see :class:`RotatedKeys` (fixed when the buffer is created).

    Returns:
        ``[b, h_kv, end − begin, d]``.
    """
    if state is None:
        return rotate_rows(begin, end)
    return state.region(name, window).get(key, begin, end, rotate_rows)


def _gone() -> None:
    """A dead weak reference (for a copied :class:`LayerState`)."""
    return None


@functools.cache
def _dynamic_layer() -> type:
    from transformers.cache_utils import DynamicLayer

    return DynamicLayer


def _signature(rotary: Any) -> tuple:
    """What the rotated values depend on besides the raw keys: parameters and frequencies' length."""
    names = ("mode", "group_size", "window", "fractional", "chunk_size", "local_window", "shift", "_seq_len")
    return tuple(getattr(rotary, name, None) for name in names)


def _version(tensor: torch.Tensor) -> int | None:
    """The in-place version counter; None for inference tensors, which keep none."""
    return None if tensor.is_inference() else tensor._version


def _fits(buffer: torch.Tensor, key: torch.Tensor) -> bool:
    return (
        buffer.shape[:2] == key.shape[:2]
        and buffer.shape[3] == key.shape[3]
        and buffer.dtype == key.dtype
        and buffer.device == key.device
    )


__all__ = ["ATTR", "MODES", "LayerState", "RotatedKeys", "lookup", "observe", "rotated"]
