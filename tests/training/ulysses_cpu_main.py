"""One rank of the DeepSpeed Ulysses check (tests/training/test_ulysses.py), launched by
``torch.distributed.run --nproc_per_node 2``: a tiny Llama whose attention is DeepSpeed's
``UlyssesSPAttentionHF`` (the sequence-parallel attention of ALST, arXiv 2506.13996) over a window cut in two
contiguous shards, on gloo. Each rank feeds its shard of the tokens, of the global position ids and of the
targets (shifted on the whole window first), sums its shard's NLL over the window's scored tokens, and the
loss and gradients are summed over the ranks (all_reduce). Rank 0 writes them, per case, to --out
(safetensors) for the test to hold against one process on the whole window.

Cases: ``yarn`` (positions: global), ``yarn-local`` (each shard numbered from 0: the mistake the check must
catch), ``dynamic_ntk`` (global positions, but the method takes its length from the shard), and the
refusal line ropescale gives for a length-dependent method (``refused.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

LENGTH, SP = 128, 2  # the window (2 x the tiny model's L = 64) and the sequence-parallel degree


def window() -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, targets) of the window: targets[t] = input_ids[t + 1], the last position unscored. # [1, T]"""
    ids = torch.randint(4, 128, (1, LENGTH), generator=torch.Generator().manual_seed(1))
    targets = torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], -100)], dim=1)
    return ids, targets


def scaled_model(method: str):
    """The tiny Llama (seed 0, SDPA), scaled x4 by ``method`` as ropescale patches it, in training mode."""
    from ropescale.patching.model import patch
    from tests.conftest import tiny_model

    model = patch(tiny_model("llama", attn_implementation="sdpa"), method, 4.0)
    return model.train()


def summed_loss(model, ids, positions, targets, scored: int) -> torch.Tensor:
    logits = model(input_ids=ids, position_ids=positions).logits  # [1, t, V]
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100, reduction="sum") / scored


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    import deepspeed
    import deepspeed.comm.torch
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF
    from safetensors.torch import save_file

    from ropescale.training.parallel import rotary_shard_problem

    # DeepSpeed JIT-compiles a shared-memory all-reduce op when its accelerator is the CPU (a C++ build, a
    # minute, a compiler): an optimisation of all_reduce this check does not need; gloo does the collectives
    deepspeed.comm.torch.build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    # replaces transformers' "sdpa" attention function in this process by the Ulysses wrapper around it
    UlyssesSPAttentionHF.register_with_transformers(
        scaled_model("yarn"), "sdpa", SP, micro_batch_size=1, seq_length=LENGTH, seq_length_is_variable=False
    )
    ids, targets = window()
    scored = int((targets != -100).sum())
    shard = slice(rank * LENGTH // SP, (rank + 1) * LENGTH // SP)
    positions = torch.arange(LENGTH)[None]  # [1, T]
    out: dict[str, torch.Tensor] = {}
    for case, method, pos in (
        ("yarn", "yarn", positions[:, shard]),
        ("yarn-local", "yarn", positions[:, : LENGTH // SP]),
        ("dynamic_ntk", "dynamic_ntk", positions[:, shard]),
    ):
        model = scaled_model(method)
        loss = summed_loss(model, ids[:, shard], pos, targets[:, shard], scored)
        loss.backward()
        dist.all_reduce(loss.detach(), op=dist.ReduceOp.SUM)
        out[f"{case}/loss"] = loss.detach().reshape(1)
        for name, p in model.named_parameters():
            grad = p.grad.detach().clone()
            dist.all_reduce(grad, op=dist.ReduceOp.SUM)
            out[f"{case}/grad/{name}"] = grad.contiguous()
    if rank == 0:
        save_file(out, str(Path(args.out) / "ulysses.safetensors"))
        refused = rotary_shard_problem("dynamic_ntk", 4.0, {}, f"ulysses sequence_parallel={SP}")
        (Path(args.out) / "refused.json").write_text(
            json.dumps({"dynamic_ntk": refused, "world": os.environ["WORLD_SIZE"]})
        )
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
