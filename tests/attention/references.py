"""Eager references for the attention-level methods, written from the papers' position formulas.

Each method is a list of regions; a region says which (query, key) pairs it holds and the positions
its queries and keys rotate at. The reference builds every region's full score matrix in float64
with :mod:`ropescale.rotary_reference` (an independent rotation), takes for each pair the score of its region,
and softmaxes: no log-sum-exp, no blocks, no kernels.
"""

from __future__ import annotations

import torch

from ropescale.rotary_reference import apply_rotary, cos_sin


def region_reference(query, key, value, q_pos, k_pos, regions, inv_freq, scale, key_mask=None):
    """Attention whose pairs take the scores of their region.

    Args:
        query: [b, h, q, d]; key, value: [b, h_kv, kv, d], unrotated.
        q_pos: [b, q], k_pos: [b, kv]: the ordinary positions; the last q keys are the queries.
        regions: ``(holds(i, j) -> bool [b, q, kv], query_positions [b, q], key_positions [b, kv])``.
        inv_freq: the rotary frequencies; scale: softmax scale.
        key_mask: [b, kv] bool, False for padding keys.

    Returns:
        ``[b, h, q, d]`` float64.
    """
    n_rep = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(n_rep, 1).double(), value.repeat_interleave(n_rep, 1).double()
    query = query.double()
    q_len, kv_len = query.shape[2], key.shape[2]
    i, j = q_pos[:, :, None], k_pos[:, None, :]  # [b, q, 1], [b, 1, kv]
    scores = torch.full((query.shape[0], query.shape[1], q_len, kv_len), float("-inf"), dtype=torch.float64)
    for holds, qp, kp in regions:
        qc, qs = cos_sin(inv_freq.double(), qp)
        kc, ks = cos_sin(inv_freq.double(), kp)
        rq = apply_rotary(query, query, qc.double(), qs.double())[0]
        rk = apply_rotary(key, key, kc.double(), ks.double())[0]
        scores = torch.where(holds(i, j)[:, None], (rq @ rk.transpose(2, 3)) * scale, scores)
    index = torch.arange(kv_len)
    causal = index[None, :] <= index[kv_len - q_len :, None]  # [q, kv]: query r is key kv − q + r
    allowed = causal[None] if key_mask is None else causal[None] & key_mask[:, None, :]
    scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    return scores.softmax(-1).nan_to_num(0.0) @ value


def random_qkv(n, q_len=None, seed=0):
    """q [2, 4, q_len, 16], k and v [2, 2, n, 16] (grouped heads), query and key positions (the last
    q_len of 0..n−1, and 0..n−1), for the kernel tests."""
    torch.manual_seed(seed)
    q_len = n if q_len is None else q_len
    q, k, v = torch.randn(2, 4, q_len, 16), torch.randn(2, 2, n, 16), torch.randn(2, 2, n, 16)
    return q, k, v, torch.arange(n - q_len, n).expand(2, -1), torch.arange(n).expand(2, -1)


def self_extend_regions(q_pos, k_pos, group_size, window, fractional=False):
    """Self-Extend (arXiv 2401.01325): far pairs at i // G + W − W // G and j // G; with
    ``fractional`` at i / G + W − W / G and j / G (float64)."""
    G, W = group_size, window
    if fractional:
        far = (q_pos.double() / G + W - W / G, k_pos.double() / G)
    else:
        far = (q_pos // G + W - W // G, k_pos // G)
    return [(lambda i, j: i - j < W, q_pos, k_pos), (lambda i, j: i - j >= W, *far)]


def dca_regions(q_pos, k_pos, chunk_size, local_window):
    """Dual Chunk Attention (arXiv 2402.17463): keys at j mod s; queries at i mod s (same chunk),
    s + i mod s capped at chunk_size (previous chunk), the cap reached by the last offset (older)."""
    s = chunk_size - local_window
    top = min(2 * s - 1, chunk_size)
    return [
        (lambda i, j: i // s == j // s, q_pos % s, k_pos % s),
        (lambda i, j: i // s - j // s == 1, (q_pos % s + s).clamp(max=chunk_size), k_pos % s),
        (lambda i, j: i // s - j // s >= 2, torch.full_like(q_pos, top), k_pos % s),
    ]


def string_regions(q_pos, k_pos, shift, local_window):
    """STRING (arXiv 2410.18745): distances >= S are moved back by S − W (the query's position)."""
    S, W = shift, local_window
    return [(lambda i, j: i - j < S, q_pos, k_pos), (lambda i, j: i - j >= S, q_pos - S + W, k_pos)]
