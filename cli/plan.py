"""``ropescale eval perplexity|passkey|needle ... --dry-run``: what the evaluation will cost, loading nothing.

The model's shape comes from its config.json (a local folder, a cached Hub config or the converted
embedded model); the estimate is :func:`ropescale.models.plan.eval_estimate` (weights, KV cache, one
layer's inference activations, logits; SDPA without materialised scores), per length, on ``--gpu``.
The methods do not change the cost of a forward (their rotary tables are per position), so one line per
length covers them all; the number of forwards per cell follows the task's protocol.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ropescale.markdown import table
from ropescale.models import plan

#: the passkey/needle answer: tokens generated after each prompt's prefill
DECODE_TOKENS = 10


def add_plan_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="load nothing, run nothing: print the estimated peak GPU memory and time per prompt and per cell for "
        "each length on --gpu (from the model's config.json; docs/plan.md)",
    )
    p.add_argument(
        "--gpu",
        default=None,
        metavar="CARD",
        help=f"with --dry-run: the card ({', '.join(plan.CARDS)}; default h100-80gb)",
    )


def _tokenizer_here(model: str) -> tuple[Any, str]:
    """``(tokenizer, "")`` of a local or converted model, else ``(None, why)``: the dry run reads no
    Hub and converts nothing."""
    from ropescale.models.embedded import EMBEDDED_MODELS
    from ropescale.models.loading import TOKENIZER_FILES, load_tokenizer

    folder = Path(model).expanduser()
    if model in EMBEDDED_MODELS:
        from ropescale._io import cache_root

        folder = cache_root() / "models" / model
    if not folder.is_dir():
        return None, f"'{model}' is not a local folder"
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):  # a config-only folder plans too
        return None, f"no tokenizer files in '{folder}'"
    return load_tokenizer(folder), ""


def print_eval_plan(args: argparse.Namespace, suite_of: Callable[[], Any]) -> int:
    """Print the plan; ``suite_of`` builds the suite the run would build, whose lengths are checked
    against the tokenizer as the run checks them (:meth:`Task.check_lengths`) before any row says "fits"."""
    from ropescale.errors import RopescaleError
    from ropescale.evals.tasks import task_table
    from ropescale.training.dryrun import config_source

    if not args.dry_run:
        raise RopescaleError("--gpu plans a run: add --dry-run (an evaluation runs on the device it finds)")
    card = plan.card(args.gpu or "h100-80gb")
    config, source = config_source(args.model)
    unchecked = ""
    task, suite = task_table.get(args.task), suite_of()
    settings = suite.settings(args.task)  # what the run would run: its prompts per cell, whether it generates
    tokenizer, unchecked = _tokenizer_here(args.model)
    if tokenizer is not None:
        task.check_lengths(suite, settings, tokenizer)
    shape = plan.Shape.from_config(config)
    dtype = "bfloat16" if args.dtype == "auto" else args.dtype
    generate = task.decodes
    methods = len(str(args.methods).split(",")) if args.methods else 1
    print(f"plan:    {args.task} on {source}, {dtype}, SDPA, {card.label}; estimates (ropescale/models/plan.py)")
    rows = []
    for length in args.lengths:
        est = plan.eval_estimate(
            shape, length, dtype, kv_cache=generate, decode_tokens=DECODE_TOKENS if generate else 0, card=card
        )
        n = task.prompts_per_cell(settings, length)
        fit = "yes" if plan.fits(est, card) else f"NO: needs {plan.gib(est.peak + plan.RESERVE_MIB * plan.MIB)}"
        per_cell, per_run = plan.duration(n * est.seconds), plan.duration(methods * n * est.seconds)
        rows.append([length, plan.gib(est.peak), fit, plan.duration(est.seconds), n, per_cell, per_run])
    heads = ["length", "peak memory", "fits", "per prompt", "prompts per cell", "per cell", "all methods"]
    print(table(heads, rows, align="rrlrrrr"))
    print(
        "memory: weights, "
        + ("the KV cache, " if generate else "")
        + "one layer's activations and the logits; a length that does not fit needs a larger --gpu "
        "(or shorter --lengths); nothing in ropescale splits one prompt over GPUs"
    )
    if unchecked:
        print(f"prompts: lengths not checked against the tokenizer ({unchecked}); the run checks them first")
    return 0
