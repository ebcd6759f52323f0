"""Documents kept apart inside a packed training window (``data.packing: documents``).

A window cut from a stream of packed documents holds the end of one document, maybe a few whole
ones, and the start of another. Trained as one sequence (``data.packing: stream``, as YaRN and
LongLoRA did with PG19), a short document's tokens attend to unrelated text thousands of positions
back. ProLong (arXiv 2410.02660) and LongRoPE2 (arXiv 2502.20082) mask attention across documents
instead; so does ``documents`` packing:

* **Positions** restart at 0 at every document's first token; within a document a PoSE window
  keeps its skips (the position ids still claim the text's distances).
* **Attention** never crosses a boundary. The window's ``seq_ids`` (document index of every token)
  become the mask through transformers' own packed-sequence machinery:

  - SDPA, eager and attention functions registered with SDPA's mask (S²-Attn, ropescale's
    attention-level methods): ``create_causal_mask`` (or the sliding-window one, per layer type)
    with ``packed_sequence_mask_function(seq_ids)`` — the function transformers applies when it
    detects packing from position ids that restart. It is given the document ids rather than
    left to detect them because its detection (``find_packed_sequence_indices``) starts a new
    sequence wherever two neighbouring position ids differ by anything but 1, which would also
    cut a PoSE window at every skip. Without PoSE both give the same block-diagonal causal mask
    (tests/training/test_packing.py checks it). The mask is materialised: n² bytes per window
    with SDPA (1 GiB at 32k tokens), where ``stream`` packing needs none; a batch whose windows
    each hold one document (most windows of book-length text) is run without one.
  - flash-attention: no mask; the cumulative document lengths (``cu_seq_lens_q/k``,
    ``max_length_q/k``, what ``DataCollatorWithFlattening(return_flash_attn_kwargs=True)`` gives)
    are passed through the model to ``flash_attn_varlen_func``, over the flattened batch.
* **Loss**: the label at each document's first token is ignored (its predecessor belongs to
  another document).

Context parallelism cannot keep documents apart (torch's context-parallel SDPA is causal only);
the recipe is refused (:func:`packing_problem`).
"""

from __future__ import annotations

from typing import Any, TypedDict

import numpy as np
import torch

PACKINGS = ("auto", "stream", "documents")


def resolved_packing(data: Any) -> str:
    """``data.packing`` with ``auto`` resolved: ``stream`` for an embedded corpus alone (whole novels:
    the windows of the shipped experiments), ``documents`` for everything else."""
    from ..data.corpus import CORPORA

    if data.packing != "auto":
        return data.packing
    return "stream" if not data.sources and data.source in CORPORA else "documents"


def packing_problem(config: Any) -> str | None:
    """Why the recipe cannot keep documents apart (one line), or None."""
    d = config.data
    if resolved_packing(d) != "documents":
        return None
    if config.train.context_parallel > 1:
        return (
            f"data.packing=documents cannot keep documents apart under train.context_parallel="
            f"{config.train.context_parallel} (torch's context-parallel attention is causal only): set data.packing=stream"
        )
    if d.recall_facts:
        return (
            "data.recall_facts needs data.packing=stream: its sentences are repeated across the whole window, "
            "and documents packing blocks attention between the window's documents"
        )
    return None


def document_segments(
    starts: np.ndarray, virtual: np.ndarray, positions: np.ndarray, offsets: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Restart a window's positions at each document and number its documents.

    Args:
        starts: stream offset of every document's first token, increasing. # [D]
        virtual: stream offset of every window token (a prepended BOS: the offset before the first
            text token, which lies in the same document). # [L]
        positions: the window's position ids before the restart (PoSE skips included). # [L]
        offsets: each token's offset in the text from the window's start (``virtual - virtual[0]``). # [L]

    Returns:
        ``(position_ids, seq_ids, first)``: positions counted from each document's start (the
        distance in the text, PoSE skips kept; a document begun before the window counts from
        the window's first token), the document index of each token (0, 1, ...), and the window
        index of every document's first token in the window. # [L], [L], [S]
    """
    doc = np.searchsorted(starts, virtual, side="right") - 1  # [L]
    new = np.r_[True, doc[1:] != doc[:-1]]  # [L]
    first = np.flatnonzero(new)  # [S]
    seq = np.cumsum(new) - 1  # [L]
    # where each document starts in the window's text (clamped: a document begun before the window)
    start_offset = np.maximum(starts[doc[first]] - virtual[0], 0)  # [S]
    anchor = positions[first] - (offsets[first] - start_offset)  # [S] position the document starts at
    return (positions - anchor[seq]).astype(np.int64), seq.astype(np.int64), first


class VarlenLengths(TypedDict):
    """Flash attention's varlen arguments: where each document starts in the flattened batch, and the
    longest document (the same for queries and keys: self-attention)."""

    cu_seq_lens_q: torch.Tensor  # [documents + 1] int32
    cu_seq_lens_k: torch.Tensor
    max_length_q: int
    max_length_k: int


class DocumentAttention(TypedDict, total=False):
    """The decoder's keyword arguments that keep a window's documents apart: an attention mask (a mask,
    one per layer type, or None), and under flash attention the varlen lengths instead of a mask."""

    attention_mask: torch.Tensor | dict[str, torch.Tensor] | None
    cu_seq_lens_q: torch.Tensor
    cu_seq_lens_k: torch.Tensor
    max_length_q: int
    max_length_k: int


def flash_varlen_kwargs(seq_ids: torch.Tensor) -> VarlenLengths:
    """``cu_seq_lens_q/k`` and ``max_length_q/k`` of the documents of a batch flattened into one
    row (each row's documents apart from the next row's). # seq_ids: [B, L]"""
    b, n = seq_ids.shape
    new = torch.ones_like(seq_ids, dtype=torch.bool)
    new[:, 1:] = seq_ids[:, 1:] != seq_ids[:, :-1]  # [B, L]: a document starts here
    starts = new.reshape(-1).nonzero().view(-1).to(torch.int32)
    cu = torch.cat([starts, torch.tensor([b * n], dtype=torch.int32, device=seq_ids.device)])
    longest = int(cu.diff().max())
    return VarlenLengths(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=longest, max_length_k=longest)


def uses_varlen(implementation: str) -> bool:
    """Whether an attention implementation takes packed documents as varlen lengths, not a mask
    (flash_attention_2/3 and the hub's flash kernels)."""
    return "flash" in implementation


def document_attention(causal_lm: Any, position_ids: torch.Tensor, seq_ids: torch.Tensor) -> DocumentAttention:
    """Keyword arguments for the decoder's forward that keep the window's documents apart (see the
    module docstring): a mask, or per-layer-type masks, or flash-attention's varlen lengths."""
    from transformers.masking_utils import (
        create_causal_mask,
        create_sliding_window_causal_mask,
        packed_sequence_mask_function,
    )

    config = causal_lm.config
    if not bool(seq_ids.any()):  # every window is one document: plain causal attention, no mask to build
        return {"attention_mask": torch.ones_like(seq_ids)}
    if uses_varlen(str(config._attn_implementation)):
        return {"attention_mask": None, **flash_varlen_kwargs(seq_ids)}
    dtype = causal_lm.get_input_embeddings().weight.dtype
    shape_only = torch.empty((*seq_ids.shape, 1), dtype=dtype, device=seq_ids.device)  # batch, length, dtype
    common = {
        "config": config,
        "inputs_embeds": shape_only,
        "attention_mask": torch.ones_like(seq_ids, dtype=torch.bool),  # no padding; stops position-id detection
        "cache": None,
        "position_ids": position_ids,
        "and_mask_function": packed_sequence_mask_function(seq_ids),
    }
    layer_types = set(getattr(config, "layer_types", None) or ())
    if layer_types:  # Qwen2/Qwen3: one mask per layer type, as the model builds them
        makers = {"full_attention": create_causal_mask, "sliding_attention": create_sliding_window_causal_mask}
        return {"attention_mask": {t: makers[t](**common) for t in layer_types if t in makers}}
    sliding = getattr(config, "sliding_window", None)  # Mistral: one mask, sliding where the model slides
    return {"attention_mask": (create_sliding_window_causal_mask if sliding else create_causal_mask)(**common)}
