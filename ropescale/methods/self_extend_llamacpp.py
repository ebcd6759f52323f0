"""Self-Extend as llama.cpp runs it: ``llama-completion --grp-attn-n G --grp-attn-w W``.

(llama.cpp rotates with the model's own frequencies, ``llama3``/YaRN included; so does ropescale
where the rule composes on a shipped scaling: :mod:`ropescale.methods.composed`.)

llama.cpp's completion tool (``tools/completion/completion.cpp`` of the llama.cpp that PyPI's
llama-cpp-python 0.3.36 vendors; the same loop as ``examples/main/main.cpp`` before the tool was
renamed) implements Self-Extend (Jin et al., arXiv 2401.01325) by editing the positions of the keys
already in its KV cache, not by LongLM's two position sets per pair (datamllab/LongLM, the
``self_extend`` method). Before each ``llama_decode`` of a batch (a prompt chunk of ``-b``
``n_batch`` tokens, or one generated token), while ``n_past ≥ ga_i + W`` it runs::

    ib = G·ga_i / W;  bd = (W / G)·(G − 1);  dd = W / G − ib·bd − W
    seq_add(ga_i, n_past, +ib·bd);  seq_div(ga_i + ib·bd, ga_i + ib·bd + W, G);  seq_add(.., +dd)
    n_past −= bd;  ga_i += W / G

(integer cell positions; the cached keys are re-rotated by each cell's accumulated position change,
the "K-shift"). Worked out, a batch whose first token is the N-th of the sequence sees, with
k = ⌊N / W⌋ blocks grouped:

    key j ≥ k·W:  at j − k·(W − W / G)             (shifted: relative distances exact)
    key j <  k·W:  cell position ⌊j / G⌋ (the causal mask reads it), rotated at 2j − ⌊j / G⌋
    query i:      at i − k·(W − W / G)

The grouped keys' rotation is not their cell position: ``pos_div`` in ``src/llama-kv-cells.h``
records the K-shift as ``shift[i] += p_old − pos[i]``, old minus new, where ``pos_add`` records
``+d``, new minus old; the K-shift rotates every key by its recorded shift, so a divided key turns
*forward* by j − ⌊j/G⌋ instead of back. llama.cpp's ``llama_kv_cache_seq_div`` before the
kv-cells refactor (2024: ``delta += pos − p_old``) had the intended sign. ``kshift="shipped"`` (the
default) reproduces the vendored code; ``kshift="intended"`` rotates grouped keys at ⌊j / G⌋, the
schedule as its authors meant it (a query is then never grouped: its distance to an ungrouped key is
exact, to a grouped one its distance to the block boundary plus the grouped distance beyond).

Which keys are grouped depends on where the batches start: the prompt is cut in ``n_batch``-token
batches (default 2048), each generated token is a batch of one. ``n_ubatch`` splits a batch for
compute only and changes nothing. The position math lives in :func:`llamacpp_positions`; the
attention function in :mod:`ropescale.attention.self_extend_llamacpp`.

The passkey example (``examples/passkey/passkey.cpp``) groups every whole prompt batch instead
(no ``--grp-attn-w``); this method reproduces the completion tool only. llama-server has no
Self-Extend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .base import RotarySpec, ScalingMethod
from .self_extend import SelfExtend, _check_int
from .types import MethodParams

#: llama.cpp's ``common_params::n_batch`` default (``common/common.h``)
LLAMACPP_N_BATCH = 2048


#: ``shipped``: llama.cpp's K-shift after ``seq_div`` as the vendored code records it; ``intended``: j // G
KSHIFTS = ("shipped", "intended")


def llamacpp_positions(
    first: torch.Tensor,
    query_positions: torch.Tensor,
    key_positions: torch.Tensor,
    group_size: int,
    window: int,
    kshift: str = "shipped",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions llama.cpp rotates queries and cached keys at while it decodes a batch starting at ``first``.

    Args:
        first: index N of the batch's first token, broadcastable against the other two.
        query_positions, key_positions: token indices (0-based, in sequence order).
        group_size, window: ``--grp-attn-n`` G and ``--grp-attn-w`` W (W a multiple of G).
        kshift: one of :data:`KSHIFTS` (module docstring).

    Returns:
        ``(query positions, key positions)`` with k = N // W blocks grouped (module docstring).
    """
    G, W = group_size, window
    k = first // W
    shift = k * (W - W // G)
    grouped = 2 * key_positions - key_positions // G if kshift == "shipped" else key_positions // G
    return query_positions - shift, torch.where(key_positions < k * W, grouped, key_positions - shift)


@dataclass(frozen=True, init=False)
class SelfExtendLlamaCpp(ScalingMethod):
    """llama.cpp's Self-Extend: ``--grp-attn-n group_size --grp-attn-w window`` with ``-b n_batch``.

    ``group_size`` defaults to the smallest G whose reach covers factor × L, ``window`` to
    min(1024, L // 4) rounded down to a multiple of G (llama.cpp asserts ``W % G == 0``).
    """

    name = "self_extend_llamacpp"
    training_free = "yes"
    runs_in = "llama.cpp's `llama-completion --grp-attn-n/-w` (not its server)"
    summary = "Self-Extend as llama.cpp's --grp-attn-n/--grp-attn-w schedule edits its KV cache (attention-level)"
    attention = "self_extend_llamacpp"

    group_size: int | None = None
    window: int | None = None
    #: llama-completion's ``-b``: the prompt is decoded in batches of this many tokens
    n_batch: int = LLAMACPP_N_BATCH
    #: ``shipped``: grouped keys turn as the vendored llama.cpp turns them; ``intended``: at j // G
    kshift: str = "shipped"

    def validate(self) -> None:
        object.__setattr__(self, "group_size", _check_int("group_size", self.group_size))
        object.__setattr__(self, "window", _check_int("window", self.window))
        object.__setattr__(self, "n_batch", _check_int("n_batch", self.n_batch))
        if self.kshift not in KSHIFTS:
            raise ValueError(f"kshift must be one of {', '.join(KSHIFTS)}, got {self.kshift!r}")
        if self.group_size is not None and self.window is not None and self.window % self.group_size:
            raise ValueError(
                f"window must be a multiple of group_size (llama.cpp asserts grp_attn_w % grp_attn_n == 0), "
                f"got window={self.window}, group_size={self.group_size}"
            )

    def resolved_window(self, spec: RotarySpec, group_size: int | None = None) -> int:
        if self.window is not None:
            return self.window
        G = group_size or self.group_size or 1
        return max(G, min(1024, spec.original_max_position_embeddings // 4) // G * G)

    def reach(self, spec: RotarySpec, group_size: int | None = None) -> int:
        """Tokens decoded one by one before a query's position reaches L.

        The token at index i = k·W + r (r < W) sits at W − W/G-shifted position r + k·W/G; the
        largest, W − 1 + k·W/G, stays below L while k ≤ G·(L − W) / W. A prompt batch keeps the
        grouping of its first token, so its last token may reach up to ``n_batch`` − 1 further.
        """
        G = group_size or self.resolved_group_size(spec)
        W, L = self.resolved_window(spec, G), spec.original_max_position_embeddings
        return (G * (L - W) // W + 1) * W

    def resolved_group_size(self, spec: RotarySpec) -> int:
        if self.group_size is not None:
            return self.group_size
        G = 1
        while self.reach(spec, G) < self.factor * spec.original_max_position_embeddings and G < 1024:
            G += 1
        return G

    def resolved_params(self, spec: RotarySpec) -> MethodParams:
        G = self.resolved_group_size(spec)
        return dict(self.params(), group_size=G, window=self.resolved_window(spec, G))

    def validate_for(self, spec: RotarySpec) -> None:
        G = self.resolved_group_size(spec)
        L, W = spec.original_max_position_embeddings, self.resolved_window(spec, G)
        if W >= L:
            raise ValueError(f"window must be smaller than the original context {L}, got {W}")
        if W % G:
            raise ValueError(f"window must be a multiple of group_size {G} (llama.cpp asserts it), got {W}")
        if self.factor > 1 and self.reach(spec) < self.factor * L:
            raise ValueError(
                f"group_size={G} with window={W} reaches {self.reach(spec)} tokens, less than "
                f"factor {self.factor:g} x {L}; use a larger group_size or a smaller factor"
            )

    def compute(self, spec: RotarySpec, seq_len: int | None = None, device: torch.device | None = None):
        return spec.base_inv_freq(device=device), 1.0  # plain RoPE; the positions move in attention

    def extended_context(self, spec: RotarySpec) -> int:
        return super().extended_context(spec) if self.factor > 1 else self.reach(spec)


def llamacpp_note(method: ScalingMethod, spec: RotarySpec) -> str | None:
    """What llama.cpp runs for a Self-Extend patch, for ``ropescale patch`` and ``doctor``; None otherwise.

    Args:
        method: the patch's method (``self_extend`` or ``self_extend_llamacpp``; others give None).
        spec: the model's original rotary geometry.

    Returns:
        Lines naming the ``llama-completion`` flags (llama-server has no Self-Extend) and, for
        LongLM's ``self_extend``, that llama.cpp computes something else.
    """
    if method.name not in ("self_extend", SelfExtendLlamaCpp.name):
        return None
    p = method.resolved_params(spec)
    G, W = p["group_size"], p["window"]
    n_ctx = method.extended_context(spec)
    batch = (
        f" -b {method.n_batch}" if isinstance(method, SelfExtendLlamaCpp) and method.n_batch != LLAMACPP_N_BATCH else ""
    )
    lines = [
        f"llama.cpp:          llama-completion -m model.gguf -c {n_ctx} --grp-attn-n {G} --grp-attn-w {W}{batch} "
        "(llama-server has no Self-Extend)"
    ]
    lines.append(
        "                    llama.cpp's seq_div turns grouped keys forward, not back (src/llama-kv-cells.h pos_div's "
        "K-shift sign, llama-cpp-python 0.3.36): far keys get distorted positions; see docs/methods.md"
        + ("; kshift=intended here is NOT what it computes" if getattr(method, "kshift", "") == "intended" else "")
    )
    if method.name == "self_extend":
        lines.append(
            "                    llama.cpp moves cached keys' positions in blocks (its own schedule, not LongLM's "
            f"two position sets): method self_extend_llamacpp (group_size={G}, window={W}) predicts what it computes"
        )
        missing = [what for what, on in (("logn", p.get("logn")), ("fractional", p.get("fractional"))) if on]
        if W % G:
            missing.append(f"window {W} not a multiple of group_size {G} (llama.cpp asserts it)")
        if missing:
            lines.append(f"                    llama.cpp has no {', '.join(missing)}")
    return "\n".join(lines)


def llamacpp_note_for_config(data: dict[str, Any]) -> str | None:
    """:func:`llamacpp_note` for a saved checkpoint's config.json (its ``ropescale`` block), or None."""
    block = data.get("ropescale")
    if not isinstance(block, dict) or block.get("method") not in ("self_extend", SelfExtendLlamaCpp.name):
        return None
    try:
        params = {k: v for k, v in (block.get("params") or {}).items() if v is not None}
        cls = SelfExtend if block["method"] == SelfExtend.name else SelfExtendLlamaCpp
        method = cls(**{k: v for k, v in params.items() if k in cls.parameter_defaults()})
        heads = data.get("num_attention_heads") or 1
        head_dim = data.get("head_dim") or data["hidden_size"] // heads
        spec = RotarySpec(head_dim, float(block["original_rope_theta"]), int(block["original_max_position_embeddings"]))
        return llamacpp_note(method, spec)
    except (KeyError, TypeError, ValueError):  # a hand-edited block: the verdict table already says what it can
        return None
