"""Attention that also returns its log-sum-exp, and the exact merge of partial attentions.

Attention-level methods (Self-Extend, Dual Chunk Attention, STRING) give different pairs (i, j)
different rotary positions. Rather than building one score matrix, each region of (i, j) pairs
runs as its own attention call with its own rotated queries and keys, returning for every query
row its output ``o_r`` and the log-sum-exp ``ℓ_r`` of its scaled scores over the keys it admits.
A softmax over the union of disjoint regions is then recovered exactly:

    ℓ = log Σ_r exp(ℓ_r),        o = Σ_r exp(ℓ_r − ℓ) · o_r

(LongLM's and ChunkLlama's flash paths merge flash-attn's ``softmax_lse`` the same way). A row that
admits no key in a region has ``ℓ_r = −inf`` and ``o_r = 0``, and drops out of the sum.

Kernels, chosen by :func:`attend` from the device:

* CPU: ``aten._scaled_dot_product_flash_attention_for_cpu`` (returns the log-sum-exp; takes an
  additive float mask; skips the upper triangle when ``causal``; GQA without repeating keys).
* CUDA: flash-attn 2 (``return_attn_probs`` gives the LSE) for unmasked half-precision calls when
  it is installed, else ``aten._scaled_dot_product_efficient_attention(compute_log_sumexp=True)``.
  Not measured here (no GPU was available); ``tests/attention/test_merge.py`` checks it when run
  on a CUDA machine.
* anything else, or ``backend="eager"``: a chunked matmul/logsumexp written out (the reference).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

BACKENDS = ("auto", "cpu", "cuda", "flash_attn", "eager")
#: masked calls are cut into row blocks so that one block's mask/scores hold about this many entries
MASK_BUDGET = 1 << 24


def attend(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scale: float,
    *,
    causal: bool = False,
    mask: torch.Tensor | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention that also returns each row's log-sum-exp.

    Args:
        query: [b, h, q, d]; key, value: [b, h_kv, kv, d] with h a multiple of h_kv (GQA).
        scale: softmax scale of the scores.
        causal: row m admits keys 0..m (needs q == kv and no ``mask``).
        mask: boolean, True = admitted, broadcastable to [b, h, q, kv] (a size-1 head dimension).
        backend: one of :data:`BACKENDS`; ``auto`` picks by device.

    Returns:
        ``(out [b, h, q, d] in the query's dtype, lse [b, h, q] float32)``; rows that admit no key
        give ``out = 0`` and ``lse = −inf``.
    """
    if causal and (mask is not None or query.shape[2] != key.shape[2]):
        raise ValueError("causal attention needs as many queries as keys and no mask")
    if query.shape[1] % key.shape[1]:
        raise ValueError(f"{query.shape[1]} query heads are not a multiple of {key.shape[1]} key heads")
    b, h, q, _ = query.shape
    if q == 0 or key.shape[2] == 0:  # the CPU kernel crashes on empty inputs
        return query.new_zeros(*query.shape[:3], value.shape[-1]), query.new_full((b, h, q), -math.inf).float()
    backend = _resolve(backend, query, mask)
    if mask is not None and mask.shape[-2] > 1 and q * key.shape[2] > MASK_BUDGET:
        step = max(1, MASK_BUDGET // key.shape[2])
        parts = [
            attend(query[:, :, r : r + step], key, value, scale, mask=mask[..., r : r + step, :], backend=backend)
            for r in range(0, q, step)
        ]
        return torch.cat([p[0] for p in parts], 2), torch.cat([p[1] for p in parts], 2)
    if backend == "eager":
        return _eager(query, key, value, scale, causal, mask)
    if backend == "flash_attn":
        return _flash_attn(query, key, value, scale, causal)
    bias = (
        None
        if mask is None
        else torch.zeros(mask.shape, dtype=query.dtype, device=query.device).masked_fill_(~mask, -math.inf)
    )
    if backend == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query, key, value, 0.0, causal, attn_mask=bias, scale=scale
        )
    else:
        out, lse = _efficient(query, key, value, scale, causal, bias)
    if mask is not None:  # the kernels give a row without keys lse 0 (CPU) or NaN: mark it empty
        empty = ~mask.any(-1).expand(b, h, q)
        if bool(empty.any()):
            out, lse = out.masked_fill(empty[..., None], 0.0), lse.masked_fill(empty, -math.inf)
    return out, lse.float()


def merge(parts: Sequence[tuple[torch.Tensor, torch.Tensor, int]], q_len: int) -> torch.Tensor:
    """Merge partial attentions over disjoint key sets into the attention over their union.

    Args:
        parts: ``(out [b, h, m, d], lse [b, h, m], start)``: rows ``start .. start + m`` of the
            ``q_len`` query rows; rows no part covers come out as zeros.
        q_len: number of query rows.

    Returns:
        ``out [b, h, q_len, d]`` (float32): Σ_r exp(lse_r − lse) · out_r with lse = log Σ_r exp(lse_r).
    """
    if all(start == 0 and lse.shape[-1] == q_len for _, lse, start in parts):  # decoding: fewer ops
        weights = torch.stack([lse for _, lse, _ in parts]).softmax(0).nan_to_num_(0.0)  # [R, b, h, q]
        return (weights[..., None] * torch.stack([out.float() for out, _, _ in parts])).sum(0)
    out0, lse0, _ = parts[0]
    b, h, _, d = out0.shape
    total = lse0.new_full((b, h, q_len), -math.inf)
    for _, lse, start in parts:
        rows = slice(start, start + lse.shape[-1])
        total[..., rows] = torch.logaddexp(total[..., rows], lse)
    merged = out0.new_zeros((b, h, q_len, d), dtype=torch.float32)
    for out, lse, start in parts:
        rows = slice(start, start + lse.shape[-1])
        weight = torch.exp(lse - total[..., rows]).nan_to_num_(0.0)  # −inf − (−inf): a row with no keys at all
        merged[..., rows, :] += weight[..., None] * out.float()
    return merged


def blockwise(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    size: int,
    scale: float,
    *,
    causal: bool = False,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Query block i against key block i, for all blocks of ``size`` rows at once.

    The whole blocks are folded into the batch for one :func:`attend` call; a shorter last query
    block takes one more call, against as many keys (``causal``) or a whole key block (otherwise),
    so no padded row or key costs work.

    Args:
        query: [b, h, nq, d]; key, value: [b, h_kv, nk, d] with nk ≥ nq (causal: nk = nq) or
            nk ≥ ⌈nq / size⌉ · size.
        size: rows per block; scale: softmax scale.
        causal: causal attention within each block pair.
        mask: boolean [1, 1, size, size] applied to every block pair.

    Returns:
        ``(out [b, h, nq, d], lse [b, h, nq])`` as :func:`attend`.
    """
    b, h, nq, _ = query.shape
    whole = nq // size
    parts = []
    if whole:

        def fold(x: torch.Tensor) -> torch.Tensor:  # [b, hx, whole · size, d] -> [b · whole, hx, size, d]
            x = x[:, :, : whole * size]
            return x.reshape(b, x.shape[1], whole, size, -1).transpose(1, 2).reshape(b * whole, x.shape[1], size, -1)

        out, lse = attend(fold(query), fold(key), fold(value), scale, causal=causal, mask=mask)
        out = out.view(b, whole, h, size, -1).transpose(1, 2).reshape(b, h, whole * size, -1)
        parts.append((out, lse.view(b, whole, h, size).transpose(1, 2).reshape(b, h, whole * size)))
    rest = nq - whole * size
    if rest:
        start = whole * size
        end = start + (rest if causal else size)
        tail_mask = None if mask is None else mask[..., :rest, :]
        rows = query[:, :, start:]
        parts.append(attend(rows, key[:, :, start:end], value[:, :, start:end], scale, causal=causal, mask=tail_mask))
    if len(parts) == 1:
        return parts[0]
    return torch.cat([p[0] for p in parts], 2), torch.cat([p[1] for p in parts], 2)


def _resolve(backend: str, query: torch.Tensor, mask: torch.Tensor | None) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}; known: {', '.join(BACKENDS)}")
    if backend != "auto":
        return backend
    if query.device.type == "cpu":
        return "cpu"
    if query.device.type == "cuda":
        if mask is None and query.dtype in (torch.float16, torch.bfloat16) and _has_flash_attn():
            return "flash_attn"
        return "cuda"
    return "eager"


def _has_flash_attn() -> bool:
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        return False
    return True


def _eager(query, key, value, scale, causal, mask):
    """The reference: fp32 scores, logsumexp and softmax, one row block at a time."""
    b, h, q, _ = query.shape
    n_rep = h // key.shape[1]
    key, value = key.repeat_interleave(n_rep, 1).float(), value.repeat_interleave(n_rep, 1).float()
    step = max(1, MASK_BUDGET // max(1, key.shape[2]))
    outs, lses = [], []
    for r in range(0, q, step):
        scores = (query[:, :, r : r + step].float() @ key.transpose(2, 3)) * scale  # [b, h, rows, kv]
        allowed = mask[..., r : r + step, :] if mask is not None and mask.shape[-2] > 1 else mask
        if causal:
            rows = torch.arange(r, r + scores.shape[2], device=query.device)[:, None]
            allowed = torch.arange(key.shape[2], device=query.device)[None, :] <= rows
        if allowed is not None:
            scores = scores.masked_fill(~allowed, -math.inf)
        lse = scores.logsumexp(-1)  # [b, h, rows]
        probs = torch.exp(scores - lse[..., None]).nan_to_num_(0.0)
        outs.append((probs @ value).to(query.dtype))
        lses.append(lse)
    return torch.cat(outs, 2), torch.cat(lses, 2)


def _flash_attn(query, key, value, scale, causal):
    """flash-attn 2 (CUDA, fp16/bf16, no mask): [b, s, h, d] layout; GQA is native."""
    from flash_attn import flash_attn_func

    out, lse, _ = flash_attn_func(
        query.transpose(1, 2),
        key.transpose(1, 2),
        value.transpose(1, 2),
        softmax_scale=scale,
        causal=causal,
        return_attn_probs=True,
    )
    return out.transpose(1, 2), lse[..., : query.shape[2]]


def _efficient(query, key, value, scale, causal, bias):
    """PyTorch's memory-efficient kernel (CUDA): equal head counts, the bias in the query's dtype."""
    n_rep = query.shape[1] // key.shape[1]
    if n_rep > 1:
        key, value = key.repeat_interleave(n_rep, 1), value.repeat_interleave(n_rep, 1)
    if bias is not None:
        kv = key.shape[2]
        if kv % 16:  # the kernel wants the bias rows 16-element aligned: pad the storage, slice the view
            padded = bias.new_zeros(*bias.shape[:-1], -(-kv // 16) * 16)
            padded[..., :kv] = bias
            bias = padded[..., :kv]
        bias = bias.expand(query.shape[0], query.shape[1], query.shape[2], kv)
    out, lse, _, _ = torch.ops.aten._scaled_dot_product_efficient_attention(
        query, key, value, bias, True, 0.0, causal, scale=scale
    )
    return out, lse[..., : query.shape[2]]  # the LSE may be padded to a multiple of 32 rows


__all__ = ["BACKENDS", "attend", "blockwise", "merge"]
