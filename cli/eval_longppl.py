"""``ropescale eval longppl``: LongPPL (arXiv 2410.23771) beside perplexity, for one or more scalings.

    ropescale eval longppl --model smollm2-135m --methods none,yarn --factor 4 --lengths 16k --output runs/longppl

The flags are a suite of the task table's LongPPL row (one method entry per ``--methods`` name), run by
the suite runner; the report is LongPPL's (:mod:`ropescale.evals.report.longppl_folder`). Key tokens are
chosen by ``--evaluator`` (default: the evaluated checkpoint itself, unscaled; the
report says which) with the authors' rule and defaults (``--trunc-len 4096``, ``--internal 1024``).
Those flags are the keys of a suite's ``longppl:`` block (:class:`~ropescale.evals.tasks.task_longppl.LongPPLSettings`).
"""

from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import TYPE_CHECKING

from ropescale import options
from ropescale.cli.command import Command
from ropescale.cli.common import (
    add_model_args,
    add_runtime_args,
    add_shipped_context_arg,
    model_slug,
    parse_params,
    typed,
)
from ropescale.cli.eval_ruler import parse_lengths
from ropescale.evals.tasks.task_longppl import LongPPLSettings
from ropescale.options import factor as _factor

if TYPE_CHECKING:
    from ropescale.evals.advice.records import SuiteEntry
    from ropescale.evals.suite.spec import Suite

EXAMPLE = "example: ropescale eval longppl --methods none,yarn --factor 4 --lengths 16k --output runs/longppl"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_shipped_context_arg(p)  # S: where a method composed on the shipped scaling starts, the report's base range
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


def suite_from_args(args: argparse.Namespace) -> Suite:
    """The suite the flags ask for (a suite file's keys): one method entry per ``--methods`` name, labelled as
    the command always named its cells (``none``, ``yarn-x4``), the texts as the suite's ``data`` (keyed by
    content), and the ``longppl:`` block of the other flags.

    Raises:
        ValueError: in the flags' words: no method, a method without a factor, a scaled evaluator without
            its factor, ``--trunc-len`` not below every length.
    """
    from ropescale.evals.suite.parse import suite_from_dict
    from ropescale.evals.tasks.task_longppl import evaluator_scaling
    from ropescale.options import from_arguments

    params = parse_params(args.param)
    names = [m.strip() for m in args.methods.split(",") if m.strip()]
    if not names:
        raise ValueError("--methods names no method")
    methods = []
    for name in names:
        scaling = _scaling(name, args.factor, params, "--methods")
        entry: SuiteEntry = {"method": name, "label": scaling.label}
        if not scaling.unscaled:
            entry.update(factor=args.factor, params=params)
        methods.append(entry)
    settings = from_arguments(LongPPLSettings, args)
    evaluator_scaling(settings)  # a scaled evaluator without its factor: said in the flag's words
    for n in args.lengths:
        if settings.trunc_len >= n:
            raise ValueError(
                f"--trunc-len {settings.trunc_len} must be below every length (got {n}): no token would be scored"
            )
    block = {k: v for k, v in asdict(settings).items() if k != "data" and v is not None}
    raw = {
        "name": f"longppl-{model_slug(args.model)}",
        "model": args.model,
        **({"shipped_context": args.shipped_context} if args.shipped_context else {}),
        "dtype": args.dtype,
        "device": args.device,
        "attn_implementation": args.attn_implementation,
        "data": settings.data,
        "methods": methods,
        "longppl": {"lengths": args.lengths, **block},
    }
    return suite_from_dict(raw, source="the flags of eval longppl")


def run_cmd(args: argparse.Namespace) -> int:
    from ropescale._lock import writing
    from ropescale.evals.report.longppl_folder import LongPPLFolder
    from ropescale.evals.suite.runner import SuiteRunner

    suite = suite_from_args(args)
    with writing(args.output, "results folder"):  # a read-only or full disk: one line naming the folder
        summary = SuiteRunner(suite, args.output, front=LongPPLFolder()).run()
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
