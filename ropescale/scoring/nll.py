"""The one chunked next-token NLL of ropescale (evaluation, search and training share it).

The full ``[T, vocab]`` logits are never materialised: only the scored positions of the final
hidden states go through ``lm_head``, ``chunk_size`` positions at a time, with the cross entropy in
fp32. With gradients enabled each chunk is recomputed in the backward pass (activation
checkpointing), so training's peak memory is ``chunk × vocab`` logits too.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

IGNORE_INDEX = -100  # label value skipped by the loss, as in transformers


def model_device(model: Any) -> torch.device:
    """The device of ``model``'s first parameter (CPU for a model without parameters)."""
    try:
        return next(model.parameters()).device
    except (AttributeError, StopIteration):
        return torch.device("cpu")


def final_hidden_states(model: Any, input_ids: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """Run a ``*ForCausalLM``'s decoder stack (no LM head) and return the last hidden states.

    ``kwargs`` (``position_ids``, ``attention_mask``) go to the decoder; the KV cache is off.
    """
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    out = decoder(input_ids=input_ids, use_cache=False, **kwargs)
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]  # [B, T, H]


def summed_nll(
    hidden: torch.Tensor, lm_head: Any, labels: torch.Tensor, chunk_size: int = 1024, softcap: float | None = None
) -> tuple[torch.Tensor, int]:
    """Summed next-token cross entropy from final hidden states, ``chunk_size`` positions at a time.

    Labels follow transformers' convention: ``labels`` has the shape of the input ids, position
    ``t`` predicts ``labels[:, t + 1]``, and ``-100`` marks tokens that are not scored.

    Args:
        hidden: final hidden states. # [B, T, H]
        lm_head: the output projection (``model.lm_head``).
        labels: target ids or -100. # [B, T]
        chunk_size: scored positions pushed through ``lm_head`` at once.
        softcap: the config's ``final_logit_softcapping``, if any.

    Returns:
        ``(total, n_scored)``: the summed NLL in nats as a float64 scalar tensor (differentiable
        when gradients are enabled; each chunk's cross entropy is fp32) and the number of scored tokens.
    """
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")
    if hidden.shape[:2] != labels.shape:
        raise ValueError(f"labels shape {tuple(labels.shape)} differs from the input's {tuple(hidden.shape[:2])}")
    targets = labels[:, 1:].to(hidden.device)  # [B, T-1]
    keep = targets != IGNORE_INDEX  # [B, T-1]
    h = hidden[:, :-1][keep]  # [N, H] only the positions that are scored
    t = targets[keep]  # [N]

    def piece(h_i: torch.Tensor, t_i: torch.Tensor) -> torch.Tensor:
        logits = lm_head(h_i).float()  # [c, V]
        if softcap:
            logits = torch.tanh(logits / softcap) * softcap
        return F.cross_entropy(logits, t_i, reduction="sum")  # []

    total = hidden.new_zeros((), dtype=torch.float64)
    for i in range(0, t.numel(), chunk_size):
        if torch.is_grad_enabled() and hidden.requires_grad:
            part = checkpoint(piece, h[i : i + chunk_size], t[i : i + chunk_size], use_reentrant=False)
        else:
            part = piece(h[i : i + chunk_size], t[i : i + chunk_size])
        total = total + part.double()
    if t.numel() == 0:
        total = total + hidden.sum() * 0.0  # keeps the graph connected for an empty batch
    return total, int(t.numel())
