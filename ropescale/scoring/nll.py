"""The one chunked next-token NLL of ropescale (evaluation, search and training share it).

The full ``[T, vocab]`` logits are never materialised: only the scored positions of the final
hidden states go through ``lm_head``, ``chunk_size`` positions at a time, with the cross entropy in
fp32. With gradients enabled each chunk is recomputed in the backward pass (activation
checkpointing), so training's peak memory is ``chunk × vocab`` logits too.

With the recipe key ``train.head_loss: fused`` (the trainer runs its steps inside :func:`head_loss`) a
plain ``nn.Linear`` head on the CPU takes the fused path instead (:class:`_FusedHeadLoss`; off by
default, see below; the CPU recipes set it). The environment variable ``ROPESCALE_FUSED_LOSS``, where
set, decides instead of the recipe (``1`` on, ``0`` off): the benchmarks time both paths with it, and
benchmarks/cpu_finetune_x2.py retrains a committed log's steps on the path they took. Each
chunk's gradients are computed in the forward pass, while its logits exist, as Liger-Kernel's fused
linear cross entropy does (github.com/linkedin/Liger-Kernel). The CPU spent a sixth of a training step
on the vocabulary's log-softmax, its backward and the casts around them (benchmarks/README.md,
"CPU speed", issue 54); the fused pass does one softmax per chunk instead of a log-softmax twice (the
recomputation) and its backward, and no head recomputation. It keeps one fp32 ``[vocab, hidden]``
gradient buffer (113 MB for SmolLM2), which is why GPUs, where memory is the scarce side, keep the
recomputing path. It saved 5 % of a SmolLM2 step (benchmarks/README.md). It is not the default
because its rounding is not the recomputing path's (a run's steps are reproduced on the path they took:
the trainer records ``head_loss: fused`` in each step that took it) and because, at first,
tests/training/test_memory.py's trainer test, run with it, ends ``loss_chunk`` 5 and 1024 1e-4 apart in
a LoRA weight; the cause was found later and is not the fused loss's own: that test runs in fp32 (the
tests resolve ``auto`` precision to fp32), and a chunk that leaves a one-row last chunk (31 scored tokens
in chunks of 5) sends that row's head matmuls through another CPU kernel (a matrix-vector product: another
summation order), in both paths. The gradients differ by fp32 rounding (2.6e-10), which Adam's first step
magnifies where a zero-initialised ``lora_B`` has a gradient near ``eps`` (the update is
``lr * g / (|g| + eps)``): 1e-4 of lr in the recomputing path, 2.5e-4 in the fused one, after one step.
With chunks of 4 or 7 (no one-row tail) both paths give the plain run's weights bit for bit.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
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

    if torch.is_grad_enabled() and hidden.requires_grad and _fusable(lm_head, hidden, softcap):
        global FUSED_CALLS
        FUSED_CALLS += 1
        return _FusedHeadLoss.apply(h, lm_head.weight, t, chunk_size), int(t.numel())

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


#: how many losses took the fused CPU path: the trainer records it in each step that did (``head_loss:
#: fused`` in ``metrics.jsonl``), since its rounding is not the recomputing path's
FUSED_CALLS = 0


#: ``train.head_loss`` of the steps in progress (:func:`head_loss`)
_HEAD_LOSS: ContextVar[str] = ContextVar("head_loss", default="recompute")
#: the choices of ``train.head_loss``
HEAD_LOSSES = ("recompute", "fused")


@contextmanager
def head_loss(mode: str) -> Iterator[None]:
    """Run the losses inside on ``mode`` (``recompute`` or ``fused``: ``train.head_loss``)."""
    if mode not in HEAD_LOSSES:
        raise ValueError(f"head loss must be one of {', '.join(HEAD_LOSSES)}, got {mode!r}")
    token = _HEAD_LOSS.set(mode)
    try:
        yield
    finally:
        _HEAD_LOSS.reset(token)


def fused_wanted(mode: str | None = None) -> bool:
    """Whether the fused path is asked for: ``ROPESCALE_FUSED_LOSS`` where set, else ``mode`` (default: the
    ``train.head_loss`` of the steps in progress)."""
    env = os.environ.get("ROPESCALE_FUSED_LOSS", "")
    return env == "1" if env else (mode or _HEAD_LOSS.get()) == "fused"


def head_problem(lm_head: Any, device: str, softcap: float | None = None) -> str | None:
    """Why the fused CPU path cannot compute this head's loss exactly as the recomputing one does, or None:
    it takes a plain bias-free ``nn.Linear`` (not a LoRA-wrapped or sharded head, whose weight is not the
    whole matrix) on the CPU, without soft-capping."""
    weight = getattr(lm_head, "weight", None)
    if device != "cpu":
        return f"it runs on the CPU only, and this run computes on {device}"
    if softcap:
        return "the model soft-caps its logits"
    plain = type(lm_head) is torch.nn.Linear and type(weight) in (torch.Tensor, torch.nn.Parameter)
    if not plain or lm_head.bias is not None:
        return f"it takes a plain bias-free nn.Linear head, and this one is a {type(lm_head).__name__}" + (
            " with a bias" if plain else ""
        )
    return None


def _fusable(lm_head: Any, hidden: torch.Tensor, softcap: float | None) -> bool:
    """Whether the fused CPU path is asked for and computes exactly what the recomputing one does."""
    return fused_wanted() and head_problem(lm_head, hidden.device.type, softcap) is None  # opt-in: the docstring


class _FusedHeadLoss(torch.autograd.Function):
    """Summed cross entropy of ``h @ weight.T`` whose gradients are computed chunk by chunk in the forward.

    For a chunk with logits ``z`` and targets ``t``: loss ``Σ (logsumexp(z) - z[t])``, and
    ``dloss/dz = softmax(z) - onehot(t)``, from which ``dh = dz @ W`` and ``dW = dz.T @ h``. The matmuls run
    in autocast's dtype when autocast is on (as ``lm_head(h)`` would), the softmax in fp32, ``dW``
    accumulates in fp32. The backward only scales the stored gradients by the incoming one.
    """

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int) -> torch.Tensor:
        device = h.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else h.dtype
        w, x_all = weight.to(dtype), h.to(dtype)
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty_like(h) if need_h else None  # [N, H]
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=h.device) if need_w else None  # [V, H]
        total = torch.zeros((), dtype=torch.float64, device=h.device)
        with torch.autocast(device, enabled=False):
            for i in range(0, x_all.shape[0], chunk):
                x, t = x_all[i : i + chunk], targets[i : i + chunk]  # [c, H], [c]
                logits = (x @ w.t()).float()  # [c, V]
                lse = torch.logsumexp(logits, dim=-1)  # [c]
                total += (lse - logits.gather(1, t[:, None]).squeeze(1)).sum().double()
                if need_h or need_w:
                    dz = logits.sub_(lse[:, None]).exp_()  # softmax, in place of the logits
                    dz[torch.arange(t.numel(), device=t.device), t] -= 1.0
                    dz = dz.to(dtype)
                    if need_h:
                        grad_h[i : i + chunk] = dz @ w
                    if need_w:
                        grad_w += (dz.t() @ x).float()
        ctx.save_for_backward(grad_h, grad_w)
        ctx.weight_dtype = weight.dtype
        return total

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None]:
        grad_h, grad_w = ctx.saved_tensors
        g = grad.float()
        dh = grad_h * g.to(grad_h.dtype) if ctx.needs_input_grad[0] else None
        dw = (grad_w * g).to(ctx.weight_dtype) if ctx.needs_input_grad[1] else None
        return dh, dw, None, None
