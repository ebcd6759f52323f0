"""``ropescale eval``: perplexity, passkey, needle, suites and lm-eval, all resumable.

Each task command builds a one-task suite from its flags and runs it through the same runner as
``ropescale eval suite``: cells are written atomically under ``--output`` as they finish, a re-run
skips finished cells, and the run ends with a table, ``report.md``, ``results.json`` and plots. A
task's flags are its settings' fields (:mod:`ropescale.evals.tasks.task_table`), as a suite file's keys are.
"""

from __future__ import annotations

import argparse
import re
from typing import Any, TypedDict

from ropescale import options
from ropescale.cli import eval_longppl as longppl_cmd  # LongPPL, its own file
from ropescale.cli import eval_ruler as ruler_cmd  # RULER's tasks, their own file
from ropescale.cli import frontier as frontier_cmd
from ropescale.cli import lm_eval as lm_eval_cmd  # `eval harness` (lm-eval itself is imported only when it runs)
from ropescale.cli.command import Command
from ropescale.cli.common import (
    ParamValue,
    _length,
    add_factor_args,
    add_model_args,
    add_runtime_args,
    add_shipped_context_arg,
    model_slug,
    parse_params,
    typed,
)
from ropescale.cli.plan import add_plan_args, print_eval_plan
from ropescale.evals.suite.size import lengths_option
from ropescale.evals.tasks import task_table
from ropescale.evals.tasks.saved import SAVED, is_saved

_LENGTHS = typed(options.lengths, "--lengths")

EXAMPLES = {
    "suite": "examples: ropescale eval suite evals/suites/smollm2-x4.yaml --output runs/smollm2-x4\n"
    "  ropescale eval suite extend-check --model ./my-llama --target-length 32768   # any suite, any model",
}


def add_arguments(group: argparse.ArgumentParser) -> None:
    """``eval``'s commands: one per row of the task table that has none of its own, then the suite, the
    harness, the frontier, RULER and LongPPL, each a :class:`~ropescale.cli.command.Command`."""
    tasks = group.add_subparsers(dest="eval_command", metavar="TASK", parser_class=type(group))
    tasks.required = True

    for row in task_table.TABLE.values():  # one command per task of the table that has none of its own
        if row.command:
            p = _task_parser(tasks, row.name, row.help, row.example)
            p.add_argument("--lengths", type=_LENGTHS, required=True, help="lengths in tokens, e.g. 4096,8192 or 4k,8k")
            task_table.add_flags(p, row)

    for command in (SUITE, lm_eval_cmd.COMMAND, frontier_cmd.COMMAND, ruler_cmd.COMMAND, longppl_cmd.COMMAND):
        command.install(tasks)


def add_suite_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("suite", help="path to a suite YAML, or a name from evals/suites/")
    p.add_argument(
        "--model",
        default=None,
        help="run the suite on this model instead of its own (lengths like L/4, 2L, target resolve to this model)",
    )
    p.add_argument(
        "--target-length",
        type=_length,
        default=None,
        metavar="N",
        help="the target length a suite's 'target' lengths and 'target/L' factors mean (default: the suite's)",
    )
    p.add_argument("--data", default=None, help="the suite's perplexity text and haystack instead of its own")
    add_shipped_context_arg(p)  # the suite's S, its composed methods' start, its baseline's context
    p.add_argument(
        "--lengths",
        type=typed(lengths_option),
        default=None,
        help="size the suite: these lengths for every task instead of the file's (4096, 4k, or relative to the "
        "model's trained or shipped context: L/4, L, 2L, S, target); a method's `only` keeps those still asked",
    )
    p.add_argument(
        "--samples",
        type=typed(options.positive_int, "--samples"),
        default=None,
        metavar="N",
        help="size the suite: at most N prompts per retrieval cell (RULER's samples; passkey/needle keep every depth, "
        "N // depths trials each, at least one); such cells are not the full suite's and go to runs/...-samplesN",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="load no weights, run nothing: print every cell (method, task, length, prompts) and its estimate",
    )
    p.add_argument("--gpu", default=None, metavar="CARD", help="with --dry-run: the card of the estimate")
    p.add_argument("--output", default=None, help="results folder (default: runs/<suite name>[-<model>][-samples<N>])")
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar: one line per finished cell (the default when stderr is not a terminal)",
    )
    p.add_argument("--verbose", action="store_true", help="print the whole report (default: its tables and paths)")
    p.add_argument(
        "--report-only",
        action="store_true",
        help="run nothing: write the report of the finished cells and, marked in progress, the prompts "
        "unfinished passkey cells have so far (while a run goes on, or after one was cut short)",
    )


def _task_parser(tasks, name: str, help_text: str, example: str = "") -> argparse.ArgumentParser:
    p = tasks.add_parser(
        name, help=help_text, description=help_text[0].upper() + help_text[1:] + ".", epilog=example or None
    )
    add_model_args(p)
    p.add_argument(
        "--method",
        default=None,
        help="one scaling method (with --param for its parameters); default: saved, the scaling the checkpoint "
        "carries (none on an unscaled one); a method named replaces the saved scaling, none removes it",
    )
    p.add_argument(
        "--methods", default=None, help="comma-separated methods to compare, e.g. none,linear,ntk,dynamic_ntk,yarn"
    )
    add_factor_args(p)  # --factor or --target-length, for every method except none
    p.add_argument(
        "--param", action="append", default=[], metavar="KEY=VALUE", help="parameter of --method, repeatable"
    )
    add_shipped_context_arg(p)
    p.add_argument(
        "--data", default=None, help="corpus name (austen, kjv), text file, folder, JSONL/Parquet, or hub:org/name"
    )
    add_runtime_args(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", default=None, help="results folder (default: runs/<task>-<model>)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--verbose", action="store_true", help="print the whole report (default: its tables and paths)")
    add_plan_args(p)  # --dry-run, --gpu: the plan (cli/plan.py)
    p.set_defaults(func=run_task_cmd, task=name)
    return p


class MethodEntry(TypedDict, total=False):
    """A suite's ``methods:`` entry, as the flags give it (``factor`` absent for saved, none and default)."""

    method: str
    params: dict[str, ParamValue]
    factor: float


def methods_from_args(args: argparse.Namespace) -> list[MethodEntry]:
    if args.method and args.methods:
        raise ValueError("give --method or --methods, not both")
    names = [m.strip() for m in (args.methods or args.method or SAVED).split(",") if m.strip()]
    params = parse_params(args.param)
    if params and len(names) > 1:
        raise ValueError("--param applies to a single --method")
    target_length = getattr(args, "target_length", None)
    if names == [SAVED] and (params or args.factor is not None or target_length is not None):
        raise ValueError(
            "--factor/--target-length/--param need a --method: without one the checkpoint runs with the scaling it "
            "carries (saved)"
        )
    compose = params.get("compose") is True
    shipped_context = getattr(args, "shipped_context", None)
    original_context = _original_context(args.model, compose, shipped_context) if target_length is not None else None
    entries = []
    for name in names:
        entry: MethodEntry = {"method": name, "params": params}
        if is_saved(name):
            entry["params"] = {}
        elif name.lower() not in ("none", "default"):
            if args.factor is None and target_length is None:
                raise ValueError(f"--factor is required for method '{name}' (or --target-length)")
            if target_length is not None:
                from ropescale.methods.factor import factor_for_target

                entry["factor"] = factor_for_target(name, target_length, original_context)
            else:
                entry["factor"] = args.factor  # a float: --factor is typed by argparse
        entries.append(entry)
    return entries


def _original_context(model: str, compose: bool = False, shipped_context: int | None = None) -> int:
    """The context a ``--target-length`` is reached from, as the patch reaches it (its config only; no weights
    are loaded): the pretraining context L, from the family table where config.json misstates it (Qwen3-8B:
    40,960 for a model pretrained at 32,768), or the shipped context for a method composed on the shipped
    scaling (:func:`ropescale.patching.shipped.shipped_of`)."""
    from ropescale.models.loading import load_config
    from ropescale.patching.shipped import shipped_of

    shipped = shipped_of(load_config(model), shipped_context)
    return shipped.context if compose else shipped.pretraining


def suite_from_args(args: argparse.Namespace) -> dict[str, Any]:
    task = args.task
    settings = task_table.settings_from_args(task_table.get(task), args)  # every setting, checked
    return {
        "name": f"{task}-{model_slug(args.model)}",
        "model": args.model,
        "dtype": args.dtype,
        "device": args.device,
        "attn_implementation": args.attn_implementation,
        "data": args.data,
        "seed": args.seed,
        "methods": methods_from_args(args),
        **({"shipped_context": args.shipped_context} if getattr(args, "shipped_context", None) else {}),
        task: settings,
    }


def run_task_cmd(args: argparse.Namespace) -> int:
    from ropescale.evals.suite.parse import suite_from_dict

    if args.dry_run or args.gpu:
        return print_eval_plan(args, lambda: suite_from_dict(suite_from_args(args)))

    suite = suite_from_dict(suite_from_args(args))
    return _run(suite, args.output or f"runs/{suite.name}", args.no_progress, args.verbose)


def run_suite_cmd(args: argparse.Namespace) -> int:
    from ropescale.evals.suite.parse import load_suite

    if args.gpu and not args.dry_run:
        raise ValueError("--gpu plans a run: add --dry-run (a suite runs on the device it finds)")
    suite = load_suite(
        args.suite,
        model=args.model,
        target_length=args.target_length,
        data=args.data,
        lengths=args.lengths,
        samples=args.samples,
        shipped_context=args.shipped_context,
    )
    output = args.output or (
        f"runs/{suite.name}"
        + (f"-{model_slug(args.model)}" if args.model else "")
        + (f"-samples{args.samples}" if args.samples else "")  # its cells are not the full suite's
    )
    if args.dry_run:
        from ropescale.cli.suite_plan import print_suite_plan
        from ropescale.evals.suite.runner import SuiteRunner

        return print_suite_plan(SuiteRunner(suite, output, progress=False).suite, output, args.gpu)
    if args.report_only:
        from ropescale.evals.suite.runner import SuiteRunner

        summary = SuiteRunner(suite, output, progress=False).report()
        print(summary["markdown"] if args.verbose else answer(summary["markdown"]))
        print(f"\nreport: {summary['report']}")
        print(f"finished {summary['cells_finished']}/{summary['cells_total']} cells (nothing run)")
        return 0
    return _run(suite, output, args.no_progress, args.verbose)


def answer(markdown: str) -> str:
    """The report's answer: each section's first table with the line that introduces it (the rest, the
    protocol and notes, stays in report.md and is printed with ``--verbose``)."""
    head, *sections = re.split(r"^## ", markdown, flags=re.M)
    # what a scaled checkpoint carries, and how its rows relate to it, is part of the answer
    lines = [p.strip() for p in head.split("\n\n") if p.strip().startswith("The checkpoint carries")]
    for section in sections:
        title, *body = section.splitlines()
        table: list[str] = []
        intro = ""
        for line in body:
            if line.startswith("|"):
                table.append(line)
            elif table:
                break
            elif line.strip():
                intro = line.strip()
        if table:
            lines += ["", f"{title}: {intro}" if intro.endswith(":") else f"{title}:", *table]
    return "\n".join(lines).strip("\n") or markdown


def _run(suite, output: str, no_progress: bool, verbose: bool = False) -> int:
    import time

    from ropescale.evals.suite.runner import run_suite

    start = time.time()
    summary = run_suite(suite, output, progress=not no_progress)
    print(summary["markdown"] if verbose else answer(summary["markdown"]))
    print(f"\nreport: {summary['report']}")
    for path in summary["plots"]:
        print(f"plot:   {path}")
    print(f"finished {summary['cells_finished']}/{summary['cells_total']} cells in {time.time() - start:.0f} s")
    return 0


SUITE = Command(
    "suite",
    help="run a YAML suite of methods × tasks × lengths",
    description="Run (or resume) a suite file: methods × tasks × lengths on one model.",
    add_arguments=add_suite_arguments,
    run=run_suite_cmd,
    epilog=EXAMPLES["suite"],
    raw=True,
)
COMMAND = Command(
    "eval",
    help="evaluate at extended lengths (perplexity, passkey, needle, suites, lm-eval)",
    description="Evaluate a model, scaled by one or several methods, at extended lengths.",
    add_arguments=add_arguments,
    run=None,
)
