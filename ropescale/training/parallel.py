"""Beyond one GPU: context parallelism (CP) through accelerate's ``ParallelismConfig`` (``cp_size``).

With ``train.context_parallel: N`` every training window is cut into ``N`` shards along the
sequence, one per rank of a CP group, and attention runs as ring attention across the group
(torch's ``context_parallel``, which accelerate enters with ``Accelerator.maybe_context_parallel``).
The model is sharded over all ranks with FSDP2 (accelerate requires it for CP). What the trainer
feeds it:

* the shards of ``input_ids``, ``position_ids`` (PoSE windows' skipped positions travel with their
  tokens) and of the *already shifted* labels: the shift that pairs position ``t`` with token
  ``t + 1`` crosses shard boundaries, so it is done on the whole window first;
* torch's load balancer cuts the window into ``2 N`` pieces (rank ``i`` gets pieces ``i`` and
  ``2N-1-i``, so causal work is even), hence ``data.seq_len`` must be divisible by ``2 N``;
* each rank's loss is its shard's summed NLL over the whole window's scored tokens ``/ N``: FSDP
  averages gradients over all ranks, which makes the gradient that of the window's mean NLL;
* the ranks of a CP group read the same windows: the data-parallel rank is ``rank // N`` of
  ``world // N`` (accelerate's mesh puts ``cp`` innermost).

Methods whose frequencies change with the length (dynamic NTK/YaRN, LongRoPE's switch) are refused:
a rank's rotary would take the length from its shard, not from the window.

Torch's CP replaces SDPA only (flash/memory-efficient/cuDNN kernels, i.e. CUDA): the attention must
be ``sdpa``, S²-Attn and sliding windows are out (accelerate drops the mask and attends causally).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from ..errors import RopescaleError
from ..scoring.nll import IGNORE_INDEX

CP_ATTENTION = ("auto", "sdpa")  # auto resolves to sdpa under CP


def context_parallel_problem(config: Any) -> str | None:
    """What is wrong with ``train.context_parallel`` in a recipe (None when nothing is): recipe-level
    checks that need no model and no processes (:func:`ropescale.training.config.validate` raises it)."""
    cp = config.train.context_parallel
    if cp < 1:
        return f"train.context_parallel must be a positive integer, got {cp!r}"
    if cp == 1:
        return None
    where = f"train.context_parallel={cp}"
    if config.data.seq_len % (2 * cp):
        return f"{where}: data.seq_len {config.data.seq_len} must be divisible by 2 x {cp} = {2 * cp} (load-balanced shards)"
    if config.model.attn_implementation not in CP_ATTENTION:
        return (
            f"{where} needs model.attn_implementation sdpa (torch's context parallel replaces SDPA), "
            f"got {config.model.attn_implementation}"
        )
    s = config.scaling
    problem = rotary_shard_problem(s.method, s.factor, s.params, where)
    if problem:
        return problem
    if config.s2attn.enabled:
        return f"{where} cannot be combined with s2attn.enabled (CP attends with full causal SDPA)"
    if config.model.sliding_window not in (None, "keep"):
        return f"{where} needs full attention: set model.sliding_window=null"
    return None


def rotary_shard_problem(method: str, factor: float, params: dict, where: str) -> str | None:
    """Why ``method`` cannot rotate a window sharded along the sequence (None when it can).

    Under context parallelism and DeepSpeed Ulysses alike, each rank runs the rotary embedding on its own
    shard, with the shard's global position ids: a static method then gives every token the frequencies
    one process would. A method whose frequencies depend on the current length (dynamic NTK/YaRN,
    LongRoPE's switch at L) would read the length off the shard's positions, which differ from rank to
    rank and from the window's (tests/training/test_ulysses.py shows the loss moving), so it is refused.
    """
    from ..methods import get_method

    if get_method(method, factor=factor, **params).varies_with_length():
        return (
            f"{where}: {method} changes its frequencies with the length, and each rank holds only its shard of "
            "the window (its rotary would see the shard's length, not the window's); use a static method "
            "(yarn, linear, ntk, llama3)"
        )
    return None


def check_accelerate_config(path: str | Path, config: Any) -> list[str]:
    """Check an accelerate config file against the recipe; returns what it will run, line by line.

    Raises:
        RopescaleError: one line naming the file and the key that does not fit.
    """
    path = Path(path)
    if not path.is_file():
        raise RopescaleError(f"accelerate config '{path}' not found")
    from .._yaml import safe_load

    data = safe_load(path.read_text(), str(path)) or {}
    kind = data.get("distributed_type", "NO")
    procs = int(data.get("num_processes", 1) or 1)
    fsdp_version = int((data.get("fsdp_config") or {}).get("fsdp_version", 1)) if kind == "FSDP" else None
    pc = data.get("parallelism_config") or {}
    cp_file = int(pc.get("parallelism_config_cp_size", 1) or 1)
    cp = config.train.context_parallel
    lines = [
        f"launch:        {path.name}: {kind}, {procs} processes" + (f", FSDP{fsdp_version}" if fsdp_version else "")
    ]
    if cp_file not in (1, cp):
        raise RopescaleError(f"{path}: parallelism_config_cp_size {cp_file} differs from train.context_parallel={cp}")
    if cp > 1:
        if fsdp_version != 2:
            raise RopescaleError(
                f"{path}: train.context_parallel={cp} needs FSDP2 (distributed_type: FSDP, fsdp_version: 2)"
            )
        if procs % cp:
            raise RopescaleError(f"{path}: num_processes {procs} is not a multiple of train.context_parallel={cp}")
        dp = procs // cp
        lines.append(
            f"parallelism:   {dp} data-parallel x {cp} context-parallel ranks; each rank holds "
            f"{config.data.seq_len // cp} of {config.data.seq_len} tokens per window"
        )
    return lines


def cp_size(accelerator: Any) -> int:
    """The accelerator's context-parallel size (1 without a parallelism config)."""
    pc = getattr(accelerator, "parallelism_config", None)
    return int(pc.cp_size) if pc is not None and pc.cp_enabled else 1


def parallelism_config(cp: int) -> Any:
    """accelerate's ``ParallelismConfig`` for ``cp`` context-parallel ranks (None for 1), the rest of
    the world sharding the model (FSDP2's ``dp_shard``).

    Raises:
        RopescaleError: the world size (``WORLD_SIZE``) is not a multiple of ``cp``.
    """
    if cp <= 1:
        return None
    from accelerate.parallelism_config import ParallelismConfig

    world = int(os.environ.get("WORLD_SIZE", "1"))
    check_processes(world, cp)
    return ParallelismConfig(dp_shard_size=world // cp, cp_size=cp)


def check_processes(processes: int, cp: int, given: str = "") -> None:
    """Refuse a number of processes (GPUs) that ``cp``-rank context-parallel groups cannot tile. The
    launch (:func:`parallelism_config`, from ``WORLD_SIZE``) and the dry run (``--gpus N``) both call
    this, so a plan is never printed for a launch that would be refused.

    Args:
        processes: the processes of the launch.
        cp: ``train.context_parallel``.
        given: where the number came from, for the message (``--gpus 3``); empty for the launch itself.

    Raises:
        RopescaleError: ``train.context_parallel=2 needs a multiple of 2 processes, got 3 (...)``.
    """
    if cp > 1 and (processes % cp or processes < cp):
        source = f"{given}; " if given else ""
        raise RopescaleError(
            f"train.context_parallel={cp} needs a multiple of {cp} processes, got {processes} "
            f"({source}accelerate launch --config_file configs/accelerate/fsdp2_cp.yaml)"
        )


def data_parallel_rank(accelerator: Any) -> tuple[int, int]:
    """``(rank, size)`` of this process among the data-parallel readers (CP groups share windows)."""
    cp = cp_size(accelerator)
    return accelerator.process_index // cp, accelerator.num_processes // cp


def shift_labels(labels: torch.Tensor) -> torch.Tensor:
    """``targets[:, t] = labels[:, t + 1]``, the last position unscored. # [B, T] -> [B, T]"""
    pad = torch.full_like(labels[:, :1], IGNORE_INDEX)
    return torch.cat([labels[:, 1:], pad], dim=1)


@contextlib.contextmanager
def context_parallel_batch(
    accelerator: Any, batch: dict[str, torch.Tensor], cp: int
) -> Iterator[dict[str, torch.Tensor]]:
    """Shard a batch over the CP group for one forward + backward (both must run inside).

    Yields the keyword arguments of :class:`~ropescale.training.modeling.CausalLMLoss`: this rank's
    shards of ``input_ids``, ``position_ids`` and shifted ``targets``, and the ``normalizer``
    (the window's scored tokens / ``cp``).
    """
    targets = shift_labels(batch["labels"])  # before sharding: the shift crosses shard boundaries
    normalizer = (targets != IGNORE_INDEX).sum().clamp(min=1).to(torch.float32) / cp
    ids, pos = batch["input_ids"], batch["position_ids"]
    buffers = [ids, pos, targets]
    with accelerator.maybe_context_parallel(
        buffers=buffers, buffer_seq_dims=[1, 1, 1], no_restore_buffers=set(buffers)
    ):
        yield {"input_ids": ids, "position_ids": pos, "targets": targets, "normalizer": normalizer}


def check_launch(processes: int) -> None:
    """Refuse a launch whose environment announces several processes while accelerate runs one
    (e.g. ``accelerate launch --num_processes 2`` where it falls back to single-process): each
    process would train alone and all would write the same run folder."""
    world = os.environ.get("WORLD_SIZE", "1")
    if world.isdigit() and int(world) > 1 and processes == 1:
        raise RopescaleError(
            f"the launch says WORLD_SIZE={world} but accelerate runs a single process here (no GPU for a "
            "multi-GPU config? set ACCELERATE_USE_CPU=1 to train on the CPU with several processes); "
            f"each of the {world} processes would train alone into the same run folder"
        )
