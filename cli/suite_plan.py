"""``ropescale eval suite NAME --dry-run``: the cells a suite would run, sized as asked, loading no weights.

A suite's cost is its cells: one line per method, task and length, with the prompts (forwards) a cell
runs and, where the model's config.json can be read here, the estimate of ``--dry-run`` of the task
commands (:mod:`.plan`: :func:`ropescale.models.plan.eval_estimate` per prompt, on ``--gpu``). The
cells already finished in the results folder are not known without hashing the weights, so the
plan lists every cell; a resumed run skips the finished ones.
"""

from __future__ import annotations

from typing import Any

from ropescale.evals.tasks import task_table
from ropescale.markdown import table

#: the tokens a retrieval prompt decodes after its prefill (as :data:`.plan.DECODE_TOKENS`)
DECODE_TOKENS = 10


def prompts(suite: Any, task: str, length: int) -> tuple[int, bool]:
    """``(forwards of length tokens one cell runs, whether they decode)``: the task row's own count
    (:meth:`~ropescale.evals.tasks.task_base.Task.prompts_per_cell`), as ``eval <task> --dry-run`` plans it."""
    row = task_table.get(task)
    return row.prompts_per_cell(suite.settings(task), length), row.decodes


def print_suite_plan(suite: Any, output: str, gpu: str | None) -> int:
    """Print the cells of ``suite`` (method with factor, task, length, prompts) and their estimate."""
    from ropescale.errors import RopescaleError
    from ropescale.models import plan

    card = plan.card(gpu or "h100-80gb")
    dtype = "bfloat16" if suite.dtype == "auto" else suite.dtype
    try:
        from ropescale.training.dryrun import config_source

        config, source = config_source(suite.model)
        shape = plan.Shape.from_config(config)
    except (RopescaleError, OSError, ValueError, KeyError) as exc:
        shape, source = None, f"no estimate ({' '.join(str(exc).split())})"
    cells = suite.cells()
    print(f"dry run: suite {suite.name} on {suite.model}: {len(cells)} cells into {output}; nothing loaded or run")
    if suite.contexts:  # on an already extended checkpoint L and S differ: say which each symbol took
        print(suite.contexts)
    if suite.sized:
        print(suite.sized)
    rows, total = [], 0.0
    for entry, task, length in cells:
        n, generate = prompts(suite, task, length)
        row = [entry.title, task, f"{length:,}", n]
        if shape is not None:
            est = plan.eval_estimate(
                shape, length, dtype, kv_cache=generate, decode_tokens=DECODE_TOKENS if generate else 0, card=card
            )
            fit = "yes" if plan.fits(est, card) else f"NO: needs {plan.gib(est.peak + plan.RESERVE_MIB * plan.MIB)}"
            total += n * est.seconds
            row += [plan.gib(est.peak), fit, plan.duration(n * est.seconds)]
        rows.append(row)
    heads = ["method", "task", "length", "prompts", *(["peak memory", "fits", "per cell"] if shape else [])]
    print(table(heads, rows, align="llrr" + ("rlr" if shape else "")))
    if shape is not None:
        print(
            f"estimate: {plan.duration(total)} of compute on {card.label} in {dtype} ({source}; "
            "ropescale/models/plan.py, not calibrated: loading, tokenizing and a busy machine add to it)"
        )
    else:
        print(f"estimate: {source}")
    print(
        "size it: --lengths (e.g. 2k,8k or L/4,L) replaces every task's lengths; --samples N caps a retrieval cell's prompts"
    )
    return 0


__all__ = ["print_suite_plan", "prompts"]
