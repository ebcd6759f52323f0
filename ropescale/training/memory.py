"""Longer windows on one device, same math: where training's activation memory goes and how to cut it.

With activation checkpointing on (``train.gradient_checkpointing``), what a step keeps between the
forward and the backward pass is each decoder layer's *input* (``layers × tokens × hidden``); what
it needs at its peak is one layer's recomputed activations, dominated by the MLP's
``tokens × intermediate`` tensors (intermediate ≈ 2.7–4 × hidden), and the loss's logits
(``tokens × vocab``). Three switches, each exact (the gradients equal the plain path's; tested):

* ``train.offload_activations`` — the checkpointed layer inputs live in pinned host memory between
  the forward and the backward pass (``torch.autograd.graph.save_on_cpu(pin_memory=True)`` around
  each checkpointed layer; the host→device copy back is ``non_blocking``). Frees
  ``layers × tokens × hidden`` bytes of device memory for two PCIe copies per layer and step. On a
  CPU-only machine the activations are already in host memory and nothing changes.
* ``train.mlp_tile_tokens`` — every decoder layer's MLP runs over tiles of that many tokens, each
  tile checkpointed, so the MLP's intermediate activations exist for one tile at a time (the tiled
  MLP of Arctic Long Sequence Training, arXiv 2506.13996; it suggests tiles of about ``hidden_size``
  tokens). The MLP is per-token, so tiling changes nothing but the peak. Costs one more MLP
  forward per step (the tile's recompute) when the layer is not checkpointed already.
* ``train.loss_chunk`` — the loss's logits exist ``loss_chunk`` positions at a time
  (:func:`ropescale.scoring.nll.summed_nll`).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

TILED_ATTR = "_ropescale_mlp_tile_tokens"


def enable_activation_checkpointing(model: Any, offload: bool = False) -> None:
    """Recompute each decoder layer's activations in the backward pass (non-reentrant: frozen
    embeddings need no ``enable_input_require_grads``).

    Args:
        model: a transformers ``PreTrainedModel`` (the causal LM under peft).
        offload: keep the checkpointed layer inputs in pinned host memory (see the module docstring).
    """
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x; the old name warns
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if offload:
        _install_checkpoint_func(model, offloaded_checkpoint)


def offloaded_checkpoint(function: Callable, *args: Any, **kwargs: Any) -> Any:
    """``torch.utils.checkpoint.checkpoint`` whose saved inputs go to pinned host memory.

    Non-reentrant checkpointing saves the layer's inputs with ``save_for_backward`` outside its own
    saved-tensor hooks, so an enclosing ``save_on_cpu`` moves exactly those inputs off the device;
    the tensors saved inside the layer are dropped by the checkpoint and recomputed as usual.
    """
    kwargs.setdefault("use_reentrant", False)
    pin = torch.cuda.is_available()  # pinned memory needs an accelerator runtime
    with torch.autograd.graph.save_on_cpu(pin_memory=pin):
        return checkpoint(function, *args, **kwargs)


def _install_checkpoint_func(model: nn.Module, func: Callable) -> None:
    """Replace the checkpoint function of every module that checkpoints (the decoder layers)."""
    for module in model.modules():
        if getattr(module, "gradient_checkpointing", False) and hasattr(module, "_gradient_checkpointing_func"):
            module._gradient_checkpointing_func = functools.partial(func, use_reentrant=False)


def tiled_forward(forward: Callable[[torch.Tensor], torch.Tensor], tile: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """A per-token ``forward(x)`` computed over tiles of ``tile`` positions (dim -2).

    With gradients enabled each tile is checkpointed, so only one tile's intermediate activations
    exist at a time in the backward pass; without gradients tiles are computed plainly (the
    intermediate tensors of one tile at a time).
    """

    @functools.wraps(forward)
    def run(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        # x: [..., n, hidden]
        if args or kwargs or x.dim() < 2 or x.shape[-2] <= tile:
            return forward(x, *args, **kwargs)
        outs = []
        for part in x.split(tile, dim=-2):  # [..., <=tile, hidden] views, no copy
            if torch.is_grad_enabled():
                outs.append(checkpoint(forward, part, use_reentrant=False))
            else:
                outs.append(forward(part))
        return torch.cat(outs, dim=-2)  # [..., n, hidden]

    return run


def decoder_mlps(model: nn.Module) -> list[nn.Module]:
    """The MLP of every decoder layer (``layer.mlp`` of Llama, Mistral, Qwen2 and most decoders)."""
    mlps = []
    for module in model.modules():
        mlp = getattr(module, "mlp", None)
        if isinstance(mlp, nn.Module) and hasattr(module, "self_attn"):
            mlps.append(mlp)
    return mlps


def tile_mlps(model: nn.Module, tile_tokens: int) -> int:
    """Make every decoder layer's MLP run over tiles of ``tile_tokens`` tokens (0: undo).

    The MLP modules are not replaced (parameter names, LoRA targets and checkpoints are unchanged):
    their ``forward`` is wrapped on the instance.

    Returns:
        The number of MLPs changed.
    """
    mlps = decoder_mlps(model)
    for mlp in mlps:
        if getattr(mlp, TILED_ATTR, 0):
            del mlp.forward  # back to the class's forward
            delattr(mlp, TILED_ATTR)
        if tile_tokens > 0:
            mlp.forward = tiled_forward(mlp.forward, tile_tokens)
            setattr(mlp, TILED_ATTR, tile_tokens)
    return len(mlps)


def check_mlp_tiling(model: nn.Module) -> str | None:
    """Why the model's MLPs cannot be tiled (None when they can): tiling needs per-token MLPs with
    a one-argument ``forward`` (a mixture-of-experts block routes over the whole sequence)."""
    mlps = decoder_mlps(model)
    if not mlps:
        return "the model has no decoder layer with an `mlp` module"
    params = inspect.signature(type(mlps[0]).forward).parameters
    if len(params) != 2:
        return f"{type(mlps[0]).__name__}.forward takes more than the hidden states"
    return None
