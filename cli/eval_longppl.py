"""``ropescale eval longppl``: LongPPL (arXiv 2410.23771) beside perplexity, for one or more scalings.

    ropescale eval longppl --model smollm2-135m --methods none,yarn --factor 4 --lengths 16k --output runs/longppl

Key tokens are chosen by ``--evaluator`` (default: the evaluated checkpoint itself, unscaled; the
report says which) with the authors' rule and defaults (``--trunc-len 4096``, ``--internal 1024``).
Those flags are the keys of a suite's ``longppl:`` block (:class:`~ropescale.evals.tasks.task_longppl.LongPPLSettings`).
"""

from __future__ import annotations

import argparse

from ropescale import options
from ropescale.cli.command import Command
from ropescale.cli.common import add_model_args, add_runtime_args, parse_params, typed
from ropescale.cli.eval_ruler import parse_lengths
from ropescale.evals.tasks.task_longppl import LongPPLSettings
from ropescale.options import factor as _factor

EXAMPLE = "example: ropescale eval longppl --methods none,yarn --factor 4 --lengths 16k --output runs/longppl"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    p.add_argument("--methods", default="none", help="comma-separated scalings, e.g. none,yarn (default: none)")
    p.add_argument("--factor", type=typed(_factor), default=None, help="factor of every method but none")
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="method parameter, repeatable")
    p.add_argument("--lengths", type=typed(parse_lengths), required=True, help="window lengths, e.g. 8k,16k")
    options.add_arguments(p, LongPPLSettings)  # --data, --documents, --evaluator...: a suite's longppl: keys
    add_runtime_args(p)
    p.add_argument("--output", default="runs/longppl", help="results folder (default: runs/longppl)")


def _scaling(method: str, factor: float | None, params: dict, flag: str):
    from ropescale.scaling import Scaling

    if method.lower() in ("none", "default"):
        return Scaling("none")
    if factor is None:
        raise ValueError(f"{flag} {method} needs a factor")
    return Scaling.from_request(method, factor, params)  # compose=true: on the shipped scaling; else it replaces it


def run_cmd(args: argparse.Namespace) -> int:
    from ropescale._lock import writing
    from ropescale.data.documents import load_documents
    from ropescale.evals.tasks.longppl_run import run_longppl
    from ropescale.evals.tasks.task_longppl import evaluator_scaling
    from ropescale.models.runtime import resolve_runtime
    from ropescale.options import from_arguments

    params = parse_params(args.param)
    names = [m.strip() for m in args.methods.split(",") if m.strip()]
    if not names:
        raise ValueError("--methods names no method")
    scalings = [_scaling(m, args.factor, params, "--methods") for m in names]
    settings = from_arguments(LongPPLSettings, args)
    judge = evaluator_scaling(settings)
    runtime = resolve_runtime(args.device, args.dtype, args.attn_implementation)
    with writing(args.output, "results folder"):  # a read-only or full disk: one line naming the folder
        summary = run_longppl(
            args.model,
            scalings,
            args.lengths,
            load_documents(settings.data),
            args.output,
            documents=settings.documents,
            evaluator=settings.evaluator,
            evaluator_scaling=judge,
            trunc_len=settings.trunc_len,
            internal=settings.internal,
            runtime=runtime,
            data=settings.data,
        )
    print(summary["markdown"])
    print(f"report: {summary['report']}")
    return 0


COMMAND = Command(
    "longppl",
    help="LongPPL: perplexity on the key tokens that need the long context, beside perplexity",
    description="LongPPL (arXiv 2410.23771) and perplexity of one or more scalings at several lengths.",
    add_arguments=add_arguments,
    run=run_cmd,
    epilog=EXAMPLE,
)
