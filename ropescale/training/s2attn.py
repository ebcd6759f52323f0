"""S²-Attn: LongLoRA's shifted sparse attention (Chen et al., arXiv 2309.12307), training only.

The sequence of ``n`` tokens is cut into groups of ``g`` tokens (LongLoRA: ``g = n/4``); each
group attends causally within itself. In half of the heads the groups are shifted by ``g/2``, so
information flows between neighbouring groups across layers. At evaluation the model uses full
attention again: the weights trained this way work with it.

Registered through transformers' attention interface (``AttentionInterface.register``) under
:data:`S2ATTN`; the model's own attention code, rotary embedding and projections are untouched.
:func:`enable_s2attn` / :func:`disable_s2attn` switch a model with ``set_attn_implementation``.

Differences from the reference (``llama_attn_replace.py``), on purpose:

* The shifted heads are not rolled around (``roll(-g/2)``), which in the reference puts the
  sequence's first ``g/2`` tokens in one group with its last ``g/2`` and lets those early tokens
  attend to the end of the sequence (a look-ahead leak the reference accepts). Here the shifted
  groups are ``[0, g/2)``, ``[g/2, 3g/2)``, ..., ``[n - g/2, n)``: strictly causal.
* With a single group (``g >= n``) there is nothing to shift and S²-Attn is full causal attention.
* Grouped-query attention: keys/values are expanded to every query head before shifting.

A registered attention function gets ``attention_mask=None`` for unpadded input (transformers
relies on ``is_causal``): the mask function registered with it is SDPA's, so None means causal
here, and a padding mask (4-D boolean) is applied within each group.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

S2ATTN = "ropescale_s2attn"
CONFIG_KEY = "ropescale_s2attn_group_ratio"  # set on the model config while S²-Attn is on


def _repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    # x: [b, h_kv, n, d] -> [b, h_kv * n_rep, n, d]
    if n_rep == 1:
        return x
    b, h, n, d = x.shape
    return x[:, :, None].expand(b, h, n_rep, n, d).reshape(b, h * n_rep, n, d)


def _grouped(x: torch.Tensor, g: int) -> torch.Tensor:
    # x: [b, h, n, d] with n % g == 0 -> [b * n/g, h, g, d]
    b, h, n, d = x.shape
    return x.reshape(b, h, n // g, g, d).transpose(1, 2).reshape(b * (n // g), h, g, d)


def _ungrouped(x: torch.Tensor, b: int) -> torch.Tensor:
    # x: [b * G, h, g, d] -> [b, h, G * g, d]
    bg, h, g, d = x.shape
    return x.reshape(b, bg // b, h, g, d).transpose(1, 2).reshape(b, h, (bg // b) * g, d)


def _mask_blocks(mask: torch.Tensor | None, g: int) -> torch.Tensor | None:
    # mask: [b, 1|h, n, n] bool (True = attend) -> its diagonal blocks [b * n/g, 1|h, g, g]
    if mask is None:
        return None
    b, h, n, _ = mask.shape
    blocks = mask.reshape(b, h, n // g, g, n // g, g).diagonal(dim1=2, dim2=4)  # [b, h, g, g, G]
    return blocks.permute(0, 4, 1, 2, 3).reshape(b * (n // g), h, g, g)


def _attend(q, k, v, mask, scaling, dropout):
    # q, k, v: [B, h, g, d]; causal within the block unless an explicit mask is given
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, scale=scaling, is_causal=True)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=scaling)


def _grouped_attention(q, k, v, mask, g: int, scaling, dropout) -> torch.Tensor:
    # q, k, v: [b, h, n, d]; attention within consecutive groups of g tokens
    b = q.shape[0]
    out = _attend(_grouped(q, g), _grouped(k, g), _grouped(v, g), _mask_blocks(mask, g), scaling, dropout)
    return _ungrouped(out, b)  # [b, h, n, d]


def s2_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group_size: int,
    attention_mask: torch.Tensor | None = None,
    scaling: float | None = None,
    dropout: float = 0.0,
) -> torch.Tensor:
    """Shifted sparse attention over full-length heads.

    Args:
        q, k, v: queries, keys, values with the same number of heads. # [b, h, n, d]
        group_size: tokens per group ``g``; ``n % g == 0`` and ``g`` even unless ``g >= n``.
        attention_mask: None (causal) or a boolean mask, True where attention is allowed. # [b, 1|h, n, n]
        scaling: softmax scale (default ``d ** -0.5``).
        dropout: attention dropout probability.

    Returns:
        The attention output. # [b, h, n, d]
    """
    n, h = q.shape[2], q.shape[1]
    g = group_size
    if g >= n:  # one group: nothing to shift
        return _attend(q, k, v, attention_mask, scaling, dropout)
    if n % g or g % 2:
        raise ValueError(f"S²-Attn needs an even group size dividing the sequence: {n} tokens, group {g}")
    half, s = h // 2, g // 2
    out_plain = _grouped_attention(
        q[:, :half],
        k[:, :half],
        v[:, :half],
        None if attention_mask is None else attention_mask[:, :half],
        g,
        scaling,
        dropout,
    )
    # shifted heads: groups [0, s), [s, s + g), ..., [n - s, n) — the middle ones are whole groups
    qs, ks, vs = q[:, half:], k[:, half:], v[:, half:]
    ms = None if attention_mask is None else attention_mask[:, half:] if attention_mask.shape[1] > 1 else attention_mask
    pieces = []
    for lo, hi in ((0, s), (n - s, n)):  # the two half groups at the ends
        m = None if ms is None else ms[:, :, lo:hi, lo:hi]
        pieces.append(_attend(qs[:, :, lo:hi], ks[:, :, lo:hi], vs[:, :, lo:hi], m, scaling, dropout))
    m = None if ms is None else ms[:, :, s : n - s, s : n - s]
    middle = _grouped_attention(qs[:, :, s : n - s], ks[:, :, s : n - s], vs[:, :, s : n - s], m, g, scaling, dropout)
    out_shifted = torch.cat([pieces[0], middle, pieces[1]], dim=2)
    return torch.cat([out_plain, out_shifted], dim=1)


def s2attn_forward(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention-interface entry point: ``(module, q, k, v, mask, ...) -> (out [b, n, h, d], None)``.

    Falls back to full causal attention outside training, for single-token decoding, and when
    keys outnumber queries (a KV cache): S²-Attn is a training-time approximation only.
    """
    # query: [b, h, n, d]; key/value: [b, h_kv, n_kv, d]
    n = query.shape[2]
    key = _repeat_kv(key, query.shape[1] // key.shape[1])
    value = _repeat_kv(value, query.shape[1] // value.shape[1])
    if attention_mask is not None and attention_mask.dtype != torch.bool:
        attention_mask = attention_mask == 0  # additive float mask -> boolean "attend"
    ratio = getattr(module.config, CONFIG_KEY, None)
    if not module.training or ratio is None or key.shape[2] != n or n == 1:
        if attention_mask is None:
            out = F.scaled_dot_product_attention(
                query, key, value, dropout_p=dropout, scale=scaling, is_causal=n > 1 and key.shape[2] == n
            )
        else:
            out = F.scaled_dot_product_attention(
                query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling
            )
    else:
        group = max(2, int(round(n * float(ratio))))
        out = s2_attention(query, key, value, group, attention_mask, scaling, dropout)
    return out.transpose(1, 2).contiguous(), None  # [b, n, h, d]


def register() -> None:
    """Register :data:`S2ATTN` with transformers' attention and mask interfaces (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(S2ATTN, s2attn_forward)
    AttentionMaskInterface.register(S2ATTN, sdpa_mask)  # None for unpadded causal input, else a bool mask


def enable_s2attn(model: Any, group_ratio: float = 0.25) -> str:
    """Switch ``model`` to S²-Attn for training; returns the implementation it used before."""
    register()
    config = model.config
    previous = getattr(config, "_ropescale_s2attn_previous", None) or config._attn_implementation
    setattr(config, CONFIG_KEY, float(group_ratio))
    config._ropescale_s2attn_previous = previous
    model.set_attn_implementation(S2ATTN)
    return previous


def disable_s2attn(model: Any, implementation: str | None = None) -> None:
    """Back to full attention (the implementation used before :func:`enable_s2attn`, or the one given)."""
    config = model.config
    previous = implementation or getattr(config, "_ropescale_s2attn_previous", None) or "sdpa"
    for key in (CONFIG_KEY, "_ropescale_s2attn_previous"):
        if hasattr(config, key):
            delattr(config, key)
    if config._attn_implementation != previous:
        model.set_attn_implementation(previous)
