"""Dual Chunk Attention as an attention function (positions: :mod:`ropescale.methods.dca`).

With s = chunk_size − local_window, a query's keys fall in three regions, each an attention call
of its own with the query rotated at that region's position (keys always rotate at j mod s, once);
the partial outputs are merged exactly by their log-sum-exp (:mod:`.merge`):

* intra-chunk, the query's own chunk up to itself: causal attention within each chunk, all chunks
  batched in one call;
* successive-chunk, the whole previous chunk: chunk c's queries against chunk c − 1's keys, all
  chunks batched in one call, no mask;
* inter-chunk, every key two chunks back or more: chunk c's queries against keys 0 .. (c − 1)s,
  one unmasked call per chunk (n/s − 2 calls, as ChunkLlama's flash path).

That is the prefill of a fresh sequence (positions 0..n−1, no padding). A decoding step (one query)
takes three key slices, of keys rotated once and kept beside the cache (:mod:`.rotated_cache`), so
a step rotates only its query and its own key. Anything else (padding, chunked prefill) takes a
masked path, where the chunks follow the positions (so a left-padded row equals the row alone).
Keys are cached before rotation (:mod:`.rotary`): cached decoding equals a full forward pass.

ChunkLlama's attention temperature (:func:`~ropescale.methods.dca.chunk_temperature`, on its query
and key cos/sin) multiplies every score of a row by its square: the query is scaled by it, per batch
row at that row's length, before the regions run. With it, a cached decoding step equals neither
a fresh forward pass over the whole prefix (a token's hidden states depend on the length they were
computed at, so deeper layers' cached keys and values come from shorter lengths) nor ChunkLlama's
cached step: ChunkLlama caches keys rotated with the factor of the step that wrote them, where this
scales the query by the current factor squared, i.e. gives every cached key the current length's
factor. A key written at length m is then weighted by f(n)/f(m) relative to ChunkLlama's, about
c·ln(n/m) (1.3e-4 on the logits of tests/attention/test_dca_cached_temperature.py, which shows it);
the prefill, and decoding with ``temperature=false``, equal the reference.
"""

from __future__ import annotations

from typing import Any

import torch

from ..methods.dca import chunk_positions, chunk_temperature
from .function import attention_function, register_attention
from .merge import attend, blockwise, merge
from .rotate_on_read import key_positions
from .rotated_cache import LayerState, rotated
from .self_extend import _finish, _mask_blocks, _rotator

NAME = "ropescale_dca"


def _dca(query, key, value, attention_mask, position_ids, rotary, scale, cached=None) -> torch.Tensor:
    coefficient = rotary.method.temperature_coefficient()
    if coefficient:
        query = query * temperature_scale(
            position_ids, rotary.spec.original_max_position_embeddings, coefficient, query
        )
    return dual_chunk_attention(
        query, key, value, attention_mask, position_ids, rotary, rotary.chunk_size, rotary.local_window, scale, cached
    )


dca_attention = attention_function(_dca, "dca")


def temperature_scale(
    position_ids: torch.Tensor, context: int, coefficient: float, query: torch.Tensor
) -> torch.Tensor:
    """The square of :func:`~ropescale.methods.dca.chunk_temperature` at each row's length n = its
    largest position + 1 (a left-padded row: its own length). # [b, 1, 1, 1], query dtype"""
    factor = chunk_temperature(position_ids.amax(dim=1) + 1, context, coefficient)  # [b]
    return (factor**2).to(query.dtype)[:, None, None, None]


def dual_chunk_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor,
    rotary: Any,
    chunk_size: int,
    local_window: int,
    scale: float,
    cached: LayerState | None = None,
) -> torch.Tensor:
    """DCA over unrotated q [b, h, q, d] and k/v [b, h_kv, kv, d]. # [b, q, h, d], query dtype

    ``cached``: the layer's rotated-key buffers (:func:`.rotated_cache.lookup`), read and extended
    by the mask-free paths; None rotates every key read.
    """
    q_len, kv_len = query.shape[2], key.shape[2]
    s = chunk_size - local_window
    k_pos = key_positions(position_ids, kv_len)
    rot = _rotator(rotary, max(kv_len, int(position_ids.max()) + 1, chunk_size + 1), query)

    def positions(p: torch.Tensor) -> dict[str, torch.Tensor]:
        return chunk_positions(p, chunk_size, local_window)

    if attention_mask is None and k_pos is None and q_len in (1, kv_len):
        n, device = kv_len, query.device

        def key_rows(a: int, b: int) -> torch.Tensor:  # keys rotate at j mod s in every region
            if a // s == (b - 1) // s:  # within one chunk: consecutive offsets (a decoding step's key)
                return rot(key[:, :, a:b], slice(a % s, a % s + b - a))
            return rot(key[:, :, a:b], positions(torch.arange(a, b, device=device))["key"])

        keys = rotated(cached, "keys", key, 0, n, key_rows)
        if q_len == 1:  # decoding: own chunk, previous chunk, everything before
            here = positions(torch.arange(n - 1, n, device=device))
            start = (n - 1) // s * s
            cuts = [(start, n, "intra"), (max(0, start - s), start, "successive"), (0, max(0, start - s), "inter")]
            cuts = [cut for cut in cuts if cut[1] > cut[0]]
            rows = rot(query.expand(-1, -1, len(cuts), -1), torch.cat([here[region] for _, _, region in cuts]))
            parts = [
                (*attend(rows[:, :, r : r + 1], keys[:, :, a:b], value[:, :, a:b], scale), 0)
                for r, (a, b, _) in enumerate(cuts)
            ]  # the query at each region's position, rotated in one call
        else:
            parts = _prefill_parts(query, keys, value, positions(torch.arange(n, device=device)), rot, s, scale)
        return _finish(merge(parts, q_len), query.dtype)

    p_k = torch.arange(kv_len, device=query.device)[None] if k_pos is None else k_pos  # [b or 1, kv]
    keys = rot(key, positions(p_k)["key"])
    parts = []
    for r0, r1, allowed in _mask_blocks(attention_mask, q_len, kv_len, query.device):
        p_q = position_ids[:, r0:r1]
        back = (p_q[:, :, None] // s - p_k[:, None, :] // s)[:, None]  # [b, 1, rows, kv]: chunks back
        here, rows = positions(p_q), query[:, :, r0:r1]
        for region, holds in (("intra", back == 0), ("successive", back == 1), ("inter", back >= 2)):
            parts.append((*attend(rot(rows, here[region]), keys, value, scale, mask=allowed & holds), r0))
    return _finish(merge(parts, q_len), query.dtype)


def _prefill_parts(query, keys, value, pos, rot, s: int, scale: float):
    """The three regions of a fresh sequence (q = kv = n), without masks."""
    n = query.shape[2]
    parts = [(*blockwise(rot(query, pos["intra"]), keys, value, s, scale, causal=True), 0)]
    if n > s:  # chunk c's queries against the whole chunk c − 1
        parts.append((*blockwise(rot(query[:, :, s:], pos["successive"][s:]), keys, value, s, scale), s))
    if n > 2 * s:  # chunk c's queries against keys 0 .. (c − 1)s: one call per chunk
        inter_q = rot(query[:, :, 2 * s :], pos["inter"][2 * s :])
        for start in range(2 * s, n, s):
            rows, end = inter_q[:, :, start - 2 * s : start - s], start - s
            parts.append((*attend(rows, keys[:, :, :end], value[:, :, :end], scale), start))
    return parts


def register() -> None:
    """Register the attention function and SDPA's mask function under :data:`NAME` (idempotent)."""
    register_attention(NAME, dca_attention)
