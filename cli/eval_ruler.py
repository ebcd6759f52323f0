"""``ropescale eval ruler``: RULER's offline tasks (lm-eval's generators) on one scaling of a model.

    ropescale eval ruler --model smollm2-135m --method yarn --factor 4 \\
        --tasks niah_multikey_2,vt --lengths 4k,16k --samples 30 --output runs/ruler

Cells land in ``OUTPUT/cells/`` as they finish (a re-run skips them); run ``--method none`` into the
same folder and the report adds short-context retention and effective length against it.
"""

from __future__ import annotations

import argparse

from ropescale import options
from ropescale.cli.command import Command
from ropescale.cli.common import add_model_args, add_runtime_args, parse_params, typed
from ropescale.evals.tasks.task_ruler import RulerSettings, essay_text
from ropescale.options import factor as _factor

EXAMPLE = (
    "example: ropescale eval ruler --method yarn --factor 4 --tasks niah_multikey_2,vt "
    "--lengths 4k,16k --samples 30 --output runs/ruler"
)


def parse_lengths(text: str) -> list[int]:
    """``"4k,16k,32768"`` → ``[4096, 16384, 32768]``: each item read by the one length parser
    (:func:`ropescale.options.length`, k = 1024), each length once (a cell per length)."""
    out = []
    for item in (t.strip() for t in str(text).split(",")):
        if not item:
            continue
        try:
            out.append(options.length(item))
        except ValueError:
            raise ValueError(f"--lengths must be positive token counts such as 4096 or 4k, got {item!r}") from None
    if not out or len(set(out)) != len(out):
        raise ValueError(f"--lengths must list distinct lengths, got {text!r}")
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    p.add_argument("--method", default=None, help="scaling method; none = unscaled; absent = the checkpoint as saved")
    p.add_argument("--factor", type=typed(_factor), default=None, help="scaling factor s")
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="method parameter, repeatable")
    p.add_argument("--lengths", type=typed(parse_lengths), required=True, help="e.g. 4k,16k or 4096,16384")
    options.add_arguments(p, RulerSettings, skip=("seed",))  # --tasks, --samples, --haystack: a suite's ruler: keys
    p.add_argument("--seed", type=int, default=0)
    add_runtime_args(p)
    p.add_argument("--output", default="runs/ruler", help="results folder (default: runs/ruler)")
    p.add_argument("--no-progress", action="store_true")


def run_cmd(args: argparse.Namespace) -> int:
    import sys

    from ropescale.evals.tasks.ruler.cell import MIN_SAMPLES
    from ropescale.evals.tasks.ruler.run import RulerRun
    from ropescale.evals.tasks.ruler.tasks import get_task
    from ropescale.models.runtime import resolve_runtime
    from ropescale.scaling import Scaling

    tasks = [get_task(t) for t in args.tasks.split(",") if t.strip()]
    if not tasks:
        raise ValueError("--tasks names no task")
    method = args.method
    if method and method.lower() not in ("none", "default") and args.factor is None:
        raise ValueError(f"--method {method} needs --factor")
    unscaled = bool(method) and method.lower() in ("none", "default")
    # compose=true: on top of the checkpoint's shipped scaling; else the run replaces it
    scaling = Scaling.from_request(method, None if unscaled else args.factor, parse_params(args.param))
    if args.samples < MIN_SAMPLES:
        print(f"ropescale: note: {args.samples} samples per cell (< {MIN_SAMPLES}): wide intervals", file=sys.stderr)
    essay = _essay(args.haystack) if any(t.haystack == "essay" for t in tasks) else None
    runtime = resolve_runtime(args.device, args.dtype, args.attn_implementation)
    run = RulerRun(
        args.model,
        scaling,
        tasks,
        args.lengths,
        args.samples,
        args.output,
        args.seed,
        runtime,
        essay,
        progress=not args.no_progress,
        prompt=args.prompt,
    )
    run.run(report=True)  # the report under the folder's lock, as the cells
    summary = run.summary
    print(summary["markdown"])
    print(f"report: {summary['report']}")
    return 0


def _essay(spec: str) -> str:
    """The text of ``CORPUS:TITLE`` (the held-out novel of the [austen] variants)."""
    try:
        return essay_text(spec)
    except ValueError as exc:
        raise ValueError(f"--{exc}") from None


COMMAND = Command(
    "ruler",
    help="RULER's offline synthetic tasks (needles, variable tracking, common/frequent words)",
    description="RULER's offline tasks as lm-eval generates and scores them, on one scaling of a model.",
    add_arguments=add_arguments,
    run=run_cmd,
    epilog=EXAMPLE,
)
