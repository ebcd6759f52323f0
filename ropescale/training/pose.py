"""PoSE: positional skip-wise training (Zhu et al., arXiv 2309.10400; reference code dwzhu-pku/PoSE).

A training window of ``L_c`` tokens is split into ``N`` chunks; chunk ``i`` keeps consecutive
position ids but is shifted by a skip ``u_i``, with ``0 = u_1 <= u_2 <= ... <= u_N <= L_t - L_c``,
so the window's positions are strictly increasing, start at 0 (where the BOS sits) and end below
the target length ``L_t``. Chunk lengths and skips are redrawn for every window, so fine-tuning
on ``L_c``-token windows touches every relative distance up to ``L_t``: a 32k target is trained
with 2k windows.

Differences from the reference code (``train_preprocess_function_pose``), on purpose:

* ``N`` chunks, not only 2 (the paper's general form); chunk boundaries uniform over the window
  (the reference draws the first of two chunks from ``[1, L_c/2]``).
* The skips are the paper's ordered uniforms ``u_i ~ U(u_{i-1}, L_t - L_c)`` with ``u_1 = 0``
  (the reference's 2023-10 revision also pins the first chunk at 0).
* ``content="skip"``: the text skips by the same amounts as the positions (``v_i = u_i``), so
  the distance the position ids claim is the distance in the text. The reference takes chunk 2's
  text from a random later place within 5 x L_c; ``content="contiguous"`` keeps the text unbroken.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class PoseLayout(NamedTuple):
    """Where a PoSE window's chunks start, in the window and in position space.

    Attributes:
        starts: index in the window of each chunk's first token, ``starts[0] == 0``. # [N]
        skips: position skip ``u_i`` of each chunk, non-decreasing, ``skips[0] == 0``. # [N]
        length: window length ``L_c``.
    """

    starts: np.ndarray
    skips: np.ndarray
    length: int

    def position_ids(self) -> np.ndarray:
        """Position id of every token of the window. # [L_c] int64, strictly increasing"""
        offsets = np.repeat(self.skips, np.diff(np.append(self.starts, self.length)))  # [L_c]
        return np.arange(self.length, dtype=np.int64) + offsets

    @property
    def span(self) -> int:
        """Positions the window covers: last position id + 1 (≤ target length)."""
        return int(self.length + self.skips[-1])


def pose_layout(length: int, target_length: int, chunks: int, rng: np.random.Generator) -> PoseLayout:
    """Draw one window's chunk boundaries and position skips.

    Args:
        length: window length ``L_c`` (tokens, BOS included).
        target_length: ``L_t``; every position id is below it.
        chunks: number of chunks ``N`` (1 = plain training with positions 0..L_c-1).
        rng: the window's own generator (the data pipeline seeds one per window, so a resumed run
            draws the same layouts).

    Returns:
        A :class:`PoseLayout`.
    """
    if not 1 <= chunks <= length:
        raise ValueError(f"chunks must be in [1, {length}], got {chunks}")
    if target_length < length:
        raise ValueError(f"target_length {target_length} is shorter than the window {length}")
    cuts = (
        np.sort(rng.choice(np.arange(1, length), size=chunks - 1, replace=False)) if chunks > 1 else np.array([], int)
    )
    starts = np.concatenate([[0], cuts]).astype(np.int64)  # [N]
    room = target_length - length
    skips = np.concatenate([[0], np.sort(rng.integers(0, room + 1, size=chunks - 1))]).astype(np.int64)  # [N]
    return PoseLayout(starts, skips, length)


def pose_text_offsets(layout: PoseLayout, content: str) -> np.ndarray:
    """Offset in the source text of every token of the window, relative to the window's start.

    ``"skip"`` moves chunk ``i``'s text by ``u_i`` (the token at position ``p`` is the text's
    token ``p``); ``"contiguous"`` keeps offsets ``0..L_c-1``. # [L_c] int64
    """
    if content == "skip":
        return layout.position_ids()
    if content == "contiguous":
        return np.arange(layout.length, dtype=np.int64)
    raise ValueError(f"PoSE content must be 'skip' or 'contiguous', got {content!r}")
