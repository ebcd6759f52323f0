"""Short windows at the original positions (``data.short_share``), to keep quality within the trained context.

LongRoPE2 (arXiv 2502.20082) trains its long samples with the rescaled RoPE and its short ones with
the original RoPE ("mixed context window training"), so the fine-tune does not trade away what the
model did within its original context L. With ``data.short_share = s``, a share ``s`` of the
micro-batches are short:

* **Windows.** The same text a long window of that slot reads, contiguous (no PoSE skips), cut into
  pieces of at most ``L`` tokens (``min(L, data.seq_len)``): positions restart at 0 in each piece
  and attention stays within it, through the documents machinery (:mod:`.packing`); a piece never
  spans two documents under ``data.packing: documents``.
* **Rotary.** The forward of a short micro-batch runs with the model's unscaled rotary frequencies
  and attention factor 1 (the original RoPE of the checkpoint's base and head size), put back as
  soon as the forward returns; the positions and the frequencies are all that differ.
* **Which.** Micro-batch ``[g, ...]`` is short when the generator seeded ``(seed, g, 4)`` draws
  below ``s``: deterministic, so a resumed run draws the same ones.

Not for methods whose frequencies change with the length (dynamic NTK/YaRN, LongRoPE): they set
their own frequencies within L already; nor for attention-level ones (Self-Extend, DCA, STRING). Refused with context parallelism (the pieces need a mask).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np


def short_problem(config: Any) -> str | None:
    """Why ``data.short_share`` cannot be used with this recipe (one line), or None."""
    from ..methods import get_method

    share = config.data.short_share
    if not share:
        return None
    if not 0 < share < 1:
        return f"data.short_share must be in [0, 1), got {share!r}"
    s = config.scaling
    method = get_method(s.method, factor=s.factor, **s.params)
    if method.attention:
        return f"data.short_share: {s.method} rotates inside attention; use a rotary method (yarn, linear, ntk, llama3)"
    if method.varies_with_length():
        return (
            f"data.short_share: {s.method} already changes its frequencies with the length (within the original "
            "context it sets its own); use a static method (yarn, linear, ntk, llama3) or data.short_share=0"
        )
    if config.train.context_parallel > 1:
        return "data.short_share cannot be used with train.context_parallel > 1 (short windows need a mask)"
    return None


def is_short(seed: int, first_index: int, share: float) -> bool:
    """Whether the micro-batch beginning with global sample ``first_index`` is short."""
    return share > 0 and np.random.default_rng([seed, first_index, 4]).random() < share


def split_short(positions: np.ndarray, seq_ids: np.ndarray | None, length: int) -> tuple[np.ndarray, np.ndarray]:
    """Cut a contiguous window (positions counted from each document's start) into pieces of at most
    ``length`` tokens: ``(positions restarting in each piece, piece index)``. # [L], [L]"""
    length = length if length > 0 else positions.size  # a spec built without short_len: one piece
    piece = positions // length
    key = piece if seq_ids is None else seq_ids * (int(piece.max()) + 1) + piece
    new = np.r_[True, key[1:] != key[:-1]]
    return (positions % length).astype(np.int64), (np.cumsum(new) - 1).astype(np.int64)


@contextlib.contextmanager
def original_rotary(causal_lm: Any) -> Iterator[None]:
    """The model computes with its unscaled rotary frequencies (attention factor 1) for the duration."""
    import torch

    from ..methods import get_method
    from ..patching.model import rotary_owner
    from ..patching.plan import original_spec

    rotary = rotary_owner(causal_lm).rotary_emb
    if not (isinstance(getattr(rotary, "inv_freq", None), torch.Tensor) and hasattr(rotary, "attention_scaling")):
        raise RuntimeError(f"data.short_share: cannot set the original frequencies of {type(rotary).__name__}")
    saved = rotary.inv_freq, rotary.attention_scaling
    inv_freq, _ = get_method("default", factor=1.0).compute(original_spec(causal_lm.config), None, saved[0].device)
    rotary.inv_freq, rotary.attention_scaling = inv_freq.to(saved[0].dtype), 1.0
    try:
        yield
    finally:
        rotary.inv_freq, rotary.attention_scaling = saved
