"""Dual Chunk Attention (An et al., "Training-Free Long-Context Scaling of Large Language Models",
arXiv 2402.17463; reference code HKUNLP/ChunkLlama): training-free, attention-level.

The sequence is cut into chunks of ``s = chunk_size − local_window`` tokens. Every key rotates at
its offset in its chunk, ``j mod s``; a query rotates at one of three positions, depending on
where the key it looks at lies (``r = i mod s`` is the query's own offset):

* same chunk (intra-chunk): at ``r``, so the relative position is the true distance i − j < s;
* the chunk just before (successive-chunk): at ``min(s + r, chunk_size)``, so the first
  ``local_window`` queries of a chunk still see their true distance to the previous chunk's keys,
  and later queries see a distance capped at ``chunk_size``;
* two or more chunks back (inter-chunk): at ``min(2s − 1, chunk_size)``, the largest position a
  successive-chunk query takes, for every query.

So every relative position the model sees lies in ``[0, chunk_size]``, which the model was trained
on as long as ``chunk_size`` < L, whatever the length. The paper writes the cap as L − 1;
ChunkLlama's released code uses ``chunk_size`` (3/4 of L by default), as here. Frequencies stay
plain RoPE, as in ChunkLlama (``ChunkLlamaRotaryEmbedding`` from ``rope_theta`` alone, whatever the
model's rotary held); on a checkpoint its maker extended with training (Llama 3.1's ``llama3``) ropescale
composes instead (:mod:`ropescale.methods.composed`: the shipped frequencies, chunk sizes and temperature
measured in the shipped context), and ``--replace`` gives ChunkLlama's plain RoPE. The attention function is
:mod:`ropescale.attention.dca`; its cached decoding step gives every cached key the current
length's temperature, where ChunkLlama keeps each key's from the step that wrote it (see there).

ChunkLlama ships two files whose defaults differ, selected here by ``variant``:

* ``chunkllama`` (the default; ``chunkllama_attn_replace.py``, its README's quick start): local
  window L/8, and beyond L the query and key cos/sin multiplied by 0.05·ln(n/L) + 1 at length n
  (logits × its square), an attention temperature that grows with the input;
* ``chunkllama_flash`` (``flash_decoding_chunkllama.py``): local window L/16, 0.1·ln(n/L) + 1.

``temperature=false`` drops the factor (the paper's formula alone). The factor multiplies both
sides of every score, so it is applied as the query scaled by its square (rotation is linear:
the same logits), per batch row with n = the row's largest position + 1, for a prefill and each
decoding step alike. Two differences from the reference, both ours: ChunkLlama keeps the largest n
its module has seen (a short prompt after a long one inherits the long one's factor) and caches
keys rotated, so a cached key keeps the factor of the step that wrote it; ropescale uses the
current length for every key, so the result depends on the input alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import RotarySpec, ScalingMethod
from .self_extend import _check_int
from .types import MethodParams

#: ChunkLlama's files: (temperature coefficient c in c·ln(n/L) + 1, local window as L / divisor)
VARIANTS = {"chunkllama": (0.05, 8), "chunkllama_flash": (0.1, 16)}


@dataclass(frozen=True, init=False)
class DualChunk(ScalingMethod):
    """Dual Chunk Attention with ``chunk_size`` (default 3L/4) and ``local_window`` (default L/8 for
    ``variant=chunkllama``, L/16 for ``chunkllama_flash``); ``temperature`` scales logits beyond L
    as the variant's reference file does.

    ``factor`` sets the target context factor × L written to the config (DCA itself has no reach:
    its positions stay within ``chunk_size`` at any length).
    """

    name = "dca"
    training_free = "yes"
    runs_in = "ropescale"
    summary = "Dual Chunk Attention: intra-, successive- and inter-chunk positions, all < chunk_size (attention-level)"
    #: patching installs ``ropescale.attention.dca`` instead of changing frequencies
    attention = "dca"

    chunk_size: int | None = None
    local_window: int | None = None
    #: scale each query beyond the trained context L by log(p + 1) / log(L) (:func:`~ropescale.attention.function.logn_scale`);
    #: ropescale's own addition (ChunkLlama has none)
    logn: bool = False
    #: which ChunkLlama file's defaults apply (:data:`VARIANTS`)
    variant: str = "chunkllama"
    #: the variant's length-dependent attention temperature beyond L (:func:`chunk_temperature`)
    temperature: bool = True

    def validate(self) -> None:
        object.__setattr__(self, "chunk_size", _check_int("chunk_size", self.chunk_size))
        object.__setattr__(self, "local_window", _check_int("local_window", self.local_window))
        key = str(self.variant).strip().lower()
        if key not in VARIANTS:
            raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, got {self.variant!r}")
        object.__setattr__(self, "variant", key)

    def temperature_coefficient(self) -> float:
        """c in the logit temperature (c·ln(n/L) + 1)² beyond L; 0 without one."""
        return VARIANTS[self.variant][0] if self.temperature else 0.0

    def resolved_chunk_size(self, spec: RotarySpec) -> int:
        return self.chunk_size if self.chunk_size is not None else spec.original_max_position_embeddings * 3 // 4

    def resolved_local_window(self, spec: RotarySpec) -> int:
        L = spec.original_max_position_embeddings
        return self.local_window if self.local_window is not None else max(1, L // VARIANTS[self.variant][1])

    def resolved_params(self, spec: RotarySpec) -> MethodParams:
        return dict(
            self.params(), chunk_size=self.resolved_chunk_size(spec), local_window=self.resolved_local_window(spec)
        )

    def validate_for(self, spec: RotarySpec) -> None:
        L, c, w = (
            spec.original_max_position_embeddings,
            self.resolved_chunk_size(spec),
            self.resolved_local_window(spec),
        )
        if c >= L:
            raise ValueError(f"chunk_size must be smaller than the original context {L}, got {c}")
        if 2 * w >= c:
            raise ValueError(f"local_window must be less than half of chunk_size {c}, got {w}")

    def compute(self, spec: RotarySpec, seq_len: int | None = None, device: torch.device | None = None):
        return spec.base_inv_freq(device=device), 1.0  # plain RoPE; chunking happens in attention


def chunk_positions(positions: torch.Tensor, chunk_size: int, local_window: int) -> dict[str, torch.Tensor]:
    """DCA's rotary positions for ``positions`` (any shape), by region.

    Returns:
        ``key`` (j mod s), ``intra`` (i mod s), ``successive`` (min(s + i mod s, chunk_size)) and
        ``inter`` (min(2s − 1, chunk_size), broadcast to the shape), with s = chunk_size − local_window.
    """
    s = chunk_size - local_window
    offset = positions % s
    return {
        "key": offset,
        "intra": offset,
        "successive": (offset + s).clamp(max=chunk_size),
        "inter": torch.full_like(positions, min(2 * s - 1, chunk_size)),
    }


def chunk_temperature(lengths: torch.Tensor, context: int, coefficient: float) -> torch.Tensor:
    """ChunkLlama's cos/sin factor at input lengths n: ``c·ln(n/L) + 1`` beyond L, else 1 (its
    ``get_mscale(n / L)``; c = 0.05 in ``chunkllama_attn_replace.py``, 0.1 in ``flash_decoding_chunkllama.py``).

    Args:
        lengths: input lengths n (any shape). context: the trained context L. coefficient: c.

    Returns:
        The factors, float64, the shape of ``lengths``.
    """
    n = lengths.double()
    return torch.where(n > context, coefficient * (n / context).log() + 1.0, torch.ones_like(n))
