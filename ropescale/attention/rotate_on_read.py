"""Rotation on read: the rotary module and helpers shared by ropescale's attention functions.

In an attention-level mode the decoder layers receive identity cos/sin (cos = 1, sin = 0), so
their own ``apply_rotary_pos_emb`` leaves q and k as they are and the KV cache stores keys
*before* rotation. The attention function (registered through transformers'
``AttentionInterface``) then rotates the queries and every key it reads, at whatever positions
and frequencies the mode needs, and hands them to SDPA.

Each attention layer reaches the rotary module through a plain attribute (not a submodule, so the
state dict and module tree are unchanged); the rotary module keeps one cos/sin table per set of
frequencies, shared by all layers of a forward pass.
"""

from __future__ import annotations

from typing import Any

import torch

from ..methods import RotarySpec, ScalingMethod
from .rotary_embedding import ScaledRotaryEmbedding

#: attribute of each attention layer that points at its :class:`AttentionRotary`
LAYER_ATTR = "_ropescale_rotary"
_TABLE_STEP = 256  # tables grow in steps, so decoding does not rebuild one per token
_SMALL = 1 << 14  # elements up to which :func:`rotate` takes the form with fewer operations


class AttentionRotary(ScaledRotaryEmbedding):
    """Rotary module for attention-level modes: identity cos/sin to the layers, tables to attention.

    Args:
        method, spec: as for :class:`ScaledRotaryEmbedding` (dynamic methods follow the current
            length ℓ = max(position_ids) + 1, as transformers does).
        mode: one of ``ropescale.attention.MODES``.
        inner: the model's own attention implementation, restored when the mode is removed.
    """

    def __init__(
        self,
        method: ScalingMethod,
        spec: RotarySpec,
        mode: str,
        inner: str,
        device: torch.device | None = None,
        native_config: Any = None,
    ):
        self._native_config = native_config
        super().__init__(method, spec, device=device)
        self.mode, self.inner = mode, inner
        self._table: tuple[Any, ...] | None = None
        self._config: Any = None  # the model's config and the attention name installed with it
        self.attention_name: str | None = None
        #: keep rotated keys beside the KV cache (:mod:`.rotated_cache`); False: rotate the cache every step
        self.rotated_keys = True
        #: the trained context L when queries are scaled by :func:`.function.logn_scale`, else None
        self.logn_context: int | None = None
        self._rotated_cache: Any = None  # weak reference to the cache of the current forward pass

    def pin_frequencies(self, inv_freq: torch.Tensor, attention_scaling: float) -> None:
        """Rotate with ``inv_freq`` and ``attention_scaling`` instead of the method's own: a mode composed on
        a shipped scaling rotates with the shipped frequencies (:func:`ropescale.attention.attention_target`).
        The attention-level methods' frequencies do not follow the length, so nothing recomputes them."""
        if self.method.varies_with_length():
            raise ValueError(f"{self.method.name}'s frequencies follow the length: they cannot be pinned")
        self.inv_freq, self.attention_scaling = inv_freq.float(), float(attention_scaling)
        self._table = None

    def _update(self, seq_len: int, device: torch.device) -> None:
        if self._native_config is None:
            return super()._update(seq_len, device)
        # A method transformers can build (dynamic NTK): its own function, fed as its rotary module
        # feeds it (ℓ as a tensor, so the base is computed in fp32), gives the very same
        # frequencies, hence bit-identical full-forward logits. Unlike its module, the result
        # depends on the current ℓ only (no growth-only cache).
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        L = self.spec.original_max_position_embeddings
        seq_len = max(seq_len, L)
        if seq_len != self._seq_len:
            config = self._native_config
            length = None if seq_len == L else torch.tensor(seq_len)
            inv_freq, self.attention_scaling = ROPE_INIT_FUNCTIONS[config.rope_parameters["rope_type"]](
                config, device, seq_len=length
            )
            self.inv_freq = inv_freq.float()
            self._seq_len = seq_len

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # x: [b, s, hidden]; position_ids: [b, s]
        if self._config is not None and self._config._attn_implementation != self.attention_name:
            # the attention was switched away (set_attn_implementation, S²-Attn for training): no
            # function of ours rotates, so the layers must, as with plain RoPE / transformers
            return super().forward(x, position_ids)
        self._update(int(position_ids.max()) + 1, x.device)
        shape = (*position_ids.shape, self.spec.dim)
        return x.new_ones(()).expand(shape), x.new_zeros(()).expand(shape)  # [b, s, d], no rotation

    def table(self, n: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin of positions 0..n−1 with the current frequencies. # [≥n, d] each

        Values are transformers' (fp32 math, scaled by the attention factor, then cast to the
        model's dtype); ``sin`` has its first half negated so :func:`rotate` needs no ``rotate_half``.
        """
        key = (self._seq_len, dtype, device)
        if self._table is None or self._table[0] != key or self._table[1] < n:
            size = -(-n // _TABLE_STEP) * _TABLE_STEP
            self._table = (key, size, *self.rows(torch.arange(size, device=device), dtype))
        return self._table[2], self._table[3]

    def rows(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin at any ``positions`` [...] (fractional ones too: Self-Extend's
        ``fractional=true``), the values :meth:`table` holds for integer ones. # [..., d] each"""
        freqs = positions.float()[..., None] * self.inv_freq.to(positions.device).float()  # [..., d/2]
        # transformers' cos(cat(f, f)) computed as cat(cos f, cos f): the same values, half the work
        cos, sin = freqs.cos() * self.attention_scaling, freqs.sin() * self.attention_scaling
        return torch.cat((cos, cos), -1).to(dtype), torch.cat((-sin, sin), -1).to(dtype)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, mode={self.mode}, inner={self.inner}"


def rotary_of(module: Any) -> AttentionRotary:
    """The rotary module an attention layer was given at install time."""
    rotary = module.__dict__.get(LAYER_ATTR)
    if rotary is None:
        raise RuntimeError(
            f"{type(module).__name__} has no ropescale rotary module: ropescale attention functions run only "
            "in models patched by ropescale.patch / ropescale.from_pretrained"
        )
    return rotary


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x·cos + rotate_half(x)·sin`` (transformers' ``apply_rotary_pos_emb``, bit for bit), with
    ``sin`` from :meth:`AttentionRotary.table`; partial rotary included (only the first d dims turn).

    Written as one product and two in-place half updates (no ``rotate_half`` copy), ~30% faster
    than the textbook form on a whole cache; a few rows (a decoding step) take the textbook form,
    which needs fewer operations. Both round the same two products and one sum per element.

    Args:
        x: [b, h, s, head_dim]; cos, sin: [b or 1, 1, s, d].
    """
    d = cos.shape[-1]
    half = d // 2
    x_rot = x if d == x.shape[-1] else x[..., :d]
    if x_rot.numel() <= _SMALL:  # a decoding step's query or new key: fewer (tiny) ops win; same values
        out = x_rot * cos + torch.cat((x_rot[..., half:], x_rot[..., :half]), dim=-1) * sin
    else:
        out = x_rot * cos
        out[..., :half] += x_rot[..., half:] * sin[..., :half]  # x1·c − x2·s (sin's first half is negated)
        out[..., half:] += x_rot[..., :half] * sin[..., half:]  # x2·c + x1·s
    return out if d == x.shape[-1] else torch.cat((out, x[..., d:]), dim=-1)


def at(table: torch.Tensor, positions: torch.Tensor | None, length: int) -> torch.Tensor:
    """Rows of a cos/sin table for ``positions`` [b, s] (None: 0..length−1). # [b or 1, 1, s, d]"""
    if positions is None:
        return table[:length][None, None]
    return table[positions][:, None]


def key_positions(position_ids: torch.Tensor, kv_length: int) -> torch.Tensor | None:
    """Positions of the keys an attention call reads. # [b, kv] or None for 0..kv−1

    The last ``q`` keys are this call's own tokens, at ``position_ids`` as given — contiguous or
    not (PoSE's skipped chunks, a search's spread layout). Keys already in the cache were appended
    in order by earlier calls (DynamicCache and its sliding variants keep them so) and are taken to
    run contiguously up to the first query: ``position_ids[:, 0] − (kv − q − j)`` for key j, which is
    what generation produces. Left padding gives negative values to padded keys, which the mask
    hides; they are clamped to 0.
    """
    past = kv_length - position_ids.shape[1]
    if bool((position_ids == torch.arange(past, kv_length, device=position_ids.device)).all()):
        return None  # the usual case, decided on the q query positions alone (a decoding step: one)
    positions = position_ids
    if past:
        offset = position_ids[:, :1] - past  # [b, 1]: position of the first cached key
        cached = (torch.arange(past, device=position_ids.device) + offset).clamp_(min=0)  # [b, past]
        positions = torch.cat((cached, position_ids), dim=1)  # [b, kv]
    return None if bool((positions == torch.arange(kv_length, device=positions.device)).all()) else positions
