"""AdamW over the trainable weights and the LR schedule, a pure function of ``(step, train.max_steps)``.

Because the schedule is a function of ``max_steps`` and nothing else is stored about it, a run
resumed with a larger ``train.max_steps`` keeps its (finished) warm-up and recomputes the decay over
the new total: from the resumed step on the LR is what a run started with the new ``max_steps``
would use at that step (:func:`sync_lr` sets it right after a checkpoint is restored).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from .config import TrainConfig


def lr_lambda(config: TrainConfig) -> Callable[[int], float]:
    """LR multiplier after ``k`` scheduler steps: linear warm-up, then linear/cosine/constant.

    The first optimizer step runs at ``lr / warmup_steps`` (HF's schedules start at 0 and waste it).
    """
    o, total = config.optim, config.train.max_steps
    warm, floor = o.warmup_steps, o.min_lr_ratio

    def f(k: int) -> float:
        if k < warm:
            return (k + 1) / warm
        if o.schedule == "constant":
            return 1.0
        progress = min(1.0, (k - warm + 1) / max(1, total - warm))
        if o.schedule == "linear":
            return floor + (1.0 - floor) * (1.0 - progress)
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return f


def build_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    """AdamW; weight decay only on LoRA matrices (never on norms, biases or embeddings)."""
    o = config.optim
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 and "lora_" in name else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": o.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=o.lr, betas=tuple(o.betas), eps=o.eps)


def sync_lr(scheduler: torch.optim.lr_scheduler.LambdaLR) -> None:
    """Set the optimizer's LR to the schedule's value at the scheduler's step.

    A restored optimizer carries the LR the checkpoint's schedule had reached; when ``max_steps``
    changed, the current schedule's value at that step differs. With an unchanged recipe this
    writes the same numbers back (an exact resume stays exact).
    """
    k = scheduler.last_epoch
    values = [base * fn(k) for base, fn in zip(scheduler.base_lrs, scheduler.lr_lambdas)]
    for group, lr in zip(scheduler.optimizer.param_groups, values):
        group["lr"] = lr
    scheduler._last_lr = values  # what get_last_lr() reports
