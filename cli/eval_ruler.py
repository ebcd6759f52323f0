"""``ropescale eval ruler``: RULER's offline tasks (lm-eval's generators) on one scaling of a model.

    ropescale eval ruler --model smollm2-135m --method yarn --factor 4 \\
        --tasks niah_multikey_2,vt --lengths 4k,16k --samples 30 --output runs/ruler

The flags are a one-method suite of the task table's RULER row, run by the suite runner (its cells, one
per length holding every task, land in ``OUTPUT/cells/`` as they finish; a re-run skips them, an
interrupted one resumes at its first undecoded prompt). Run ``--method none`` into the same folder and
the report (:mod:`ropescale.evals.report.ruler_folder`) adds short-context retention and effective
length against it; cells written by ``eval ruler`` before it ran through the suite runner are read too.
"""

from __future__ import annotations

import argparse
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
from ropescale.evals.tasks.task_ruler import RulerSettings, essay_text, task_names
from ropescale.options import factor as _factor

if TYPE_CHECKING:
    from ropescale.evals.advice.records import SuiteEntry
    from ropescale.evals.suite.spec import Suite
    from ropescale.evals.tasks.task_base import SuiteBlock

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
    add_shipped_context_arg(p)  # S: where a method composed on the shipped scaling starts, the report's base range
    p.add_argument("--method", default=None, help="scaling method; none = unscaled; absent = the checkpoint as saved")
    p.add_argument("--factor", type=typed(_factor), default=None, help="scaling factor s")
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="method parameter, repeatable")
    p.add_argument("--lengths", type=typed(parse_lengths), required=True, help="e.g. 4k,16k or 4096,16384")
    options.add_arguments(p, RulerSettings, skip=("seed",))  # --tasks, --samples, --haystack: a suite's ruler: keys
    p.add_argument("--seed", type=int, default=0)
    add_runtime_args(p)
    p.add_argument("--output", default="runs/ruler", help="results folder (default: runs/ruler)")
    p.add_argument("--no-progress", action="store_true")


def suite_from_args(args: argparse.Namespace) -> Suite:
    """The one-method suite the flags ask for (a suite file's keys): ``--method`` absent is the checkpoint's
    own scaling (``saved``), ``none`` the unscaled model; its label is the row the report gives it
    (``yarn-x4``, ``+chat`` for chat prompts), as cells of the earlier layout named it."""
    from ropescale.evals.suite.parse import suite_from_dict
    from ropescale.evals.tasks.ruler.earlier import row_label
    from ropescale.scaling import Scaling

    method = args.method
    if method and method.lower() not in ("none", "default") and args.factor is None:
        raise ValueError(f"--method {method} needs --factor")
    unscaled = bool(method) and method.lower() in ("none", "default")
    params = parse_params(args.param)
    # compose=true: on top of the checkpoint's shipped scaling; else the run replaces it
    scaling = Scaling.from_request(method, None if unscaled else args.factor, params)
    entry: SuiteEntry = {"method": method or "saved", "label": row_label(scaling, args.prompt)}
    if method and not unscaled:
        entry.update(factor=args.factor, params=params)
    block: SuiteBlock = {"lengths": args.lengths, "tasks": list(task_names(args.tasks)), "samples": args.samples}
    block.update({k: v for k, v in (("haystack", args.haystack), ("prompt", args.prompt)) if v != _default(k)})
    raw = {
        "name": f"ruler-{model_slug(args.model)}",
        "model": args.model,
        **({"shipped_context": args.shipped_context} if args.shipped_context else {}),
        "dtype": args.dtype,
        "device": args.device,
        "attn_implementation": args.attn_implementation,
        "seed": args.seed,
        "methods": [entry],
        "ruler": block,
    }
    return suite_from_dict(raw, source="the flags of eval ruler")


def _default(key: str) -> str:
    from dataclasses import fields

    return next(f.default for f in fields(RulerSettings) if f.name == key)


def run_cmd(args: argparse.Namespace) -> int:
    import sys

    from ropescale.evals.report.ruler_folder import RulerFolder
    from ropescale.evals.suite.runner import SuiteRunner
    from ropescale.evals.tasks.ruler.cell import MIN_SAMPLES
    from ropescale.evals.tasks.ruler.tasks import get_task

    tasks = [get_task(t) for t in task_names(args.tasks)]
    if not tasks:
        raise ValueError("--tasks names no task")
    suite = suite_from_args(args)
    if args.samples < MIN_SAMPLES:
        print(f"ropescale: note: {args.samples} samples per cell (< {MIN_SAMPLES}): wide intervals", file=sys.stderr)
    if args.prompt != "plain":  # in the flag's words, before the suite's (``ruler.prompt: ...``) and the weights
        from ropescale.evals.tasks.ruler.prompt import check_prompt
        from ropescale.models.loading import load_tokenizer

        check_prompt(args.prompt, load_tokenizer(args.model), str(args.model))
    essay = _essay(args.haystack) if any(t.haystack == "essay" for t in tasks) else None
    summary = SuiteRunner(suite, args.output, progress=not args.no_progress, front=RulerFolder(essay)).run()
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
