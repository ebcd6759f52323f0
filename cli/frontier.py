"""``ropescale eval frontier``: which methods keep both native perplexity and retrieval at N / L.

Runs (or resumes) a suite of candidate methods at the factor N / L, perplexity and passkey at
several lengths up to N (:func:`ropescale.evals.advice.frontier.frontier_suite`), then writes
``frontier.md`` and ``frontier.png`` beside the suite's results. ``--results`` reads an existing
suite run instead and runs nothing. ``ropescale recommend`` reads the same results.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ropescale.cli.command import Command
from ropescale.cli.common import _length, _positive_int, add_model_args, add_original_context_arg, unit_floats

EXAMPLE = """examples:
  ropescale eval frontier --target-length 16384 --output runs/frontier-16k      # runs the suite (resumable)
  ropescale eval frontier --target-length 16384 --methods self_extend,dca --trials 2
  ropescale eval frontier --results runs/smollm2-frontier-16k --target-length 16384   # report only
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_original_context_arg(p)
    p.add_argument("--target-length", type=_length, required=True, metavar="N", help="the context to reach")
    p.add_argument("--results", default=None, metavar="PATH", help="an existing suite run (folder or results.json)")
    p.add_argument(
        "--methods",
        default=None,
        help="comma-separated candidates among yarn, ntk, dynamic_ntk, self_extend, dca, string-yarn (default: all "
        "of those), self_extend-logn, dca-logn, dca-flash, self_extend-float, dca-l16-notemp, "
        "string-yarn-own-factor (only when named; evals/advice/frontier.py OPTIONAL_PARAMS)",
    )
    p.add_argument("--depths", default="0.2,0.4,0.6,0.8", help="passkey depths per length")
    p.add_argument("--trials", type=_positive_int, default=1, help="passkey trials per depth and length")
    p.add_argument(
        "--jitter",
        type=float,
        default=0.0,
        help="each passkey trial's depth drawn from depth +- JITTER (e.g. 0.1 with the default depths), so "
        "trials do not share positions (docs/evaluation.md); 0 (default): fixed depths",
    )
    p.add_argument(
        "--max-tokens", type=_length, default=4096, help="tokens scored per perplexity length (at least a window)"
    )
    p.add_argument("--data", default="austen", help="perplexity text and passkey haystack (as `eval perplexity`)")
    p.add_argument("--output", default=None, help="results folder (default: runs/frontier-<model>-<N>)")
    p.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="PATH",
        help="rows measured on the same protocol to show beside the frontier (an evals/measured file or a "
        "results.json): a fine-tuned model, say; never a candidate (repeatable)",
    )
    p.add_argument(
        "--evidence",
        default=None,
        metavar="JSON",
        help="also write the suite's rows (not --also's) as shipped evidence (evals/measured/*.json) with --command; "
        "an existing file keeps its cells and gains the new ones (a cell in progress there is replaced)",
    )
    p.add_argument("--command", default=None, help="with --evidence: the command recorded beside every number")
    p.add_argument("--note", default=None, help="with --evidence: the protocol note of the file")
    p.add_argument(
        "--battery",
        action="append",
        default=[],
        metavar="DIR",
        help="a folder of `ropescale eval ruler` cells (or evals/measured/ruler/<folder>): the report gains each "
        "method's worst RULER retention at <= L and its relative effective length (repeatable)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the suite it would run, run nothing")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--verbose", action="store_true", help="print the whole report (every method, its cells, the rules)")


def run(args: argparse.Namespace) -> int:
    import yaml

    from ropescale._io import atomic_write_text
    from ropescale.evals.advice.evidence import load_results
    from ropescale.evals.advice.frontier import (
        format_frontier,
        format_verdict,
        frontier_suite,
        plot_frontier,
        with_rows,
    )
    from ropescale.evals.suite.parse import suite_from_dict
    from ropescale.evals.suite.runner import run_suite

    if args.results:
        path = Path(args.results)
        results = path / "results.json" if path.is_dir() else path
    else:
        methods = [m.strip() for m in args.methods.split(",") if m.strip()] if args.methods else None
        original = _original_context(args.model, args.original_max_position_embeddings)
        if args.target_length <= original:
            raise ValueError(f"--target-length {args.target_length} is within the trained context {original}")
        raw = frontier_suite(
            args.model,
            original,
            args.target_length,
            methods,
            unit_floats("--depths", args.depths),
            args.trials,
            args.data,
            args.max_tokens,
            args.jitter,
            saved=_scaled(args.model),  # a scaled checkpoint's own scaling is measured too, as saved
        )
        suite = suite_from_dict(raw)  # validated whole before anything loads
        if args.dry_run:
            print(yaml.safe_dump(raw, sort_keys=False).rstrip())
            return 0
        out = Path(args.output or f"runs/{suite.name}")
        run_suite(suite, out, progress=not args.no_progress)
        results = out / "results.json"
    ev = load_results(results)
    if ev is None:
        raise ValueError(f"'{results}' is not a suite's results.json")
    original = _original_context(ev.model, args.original_max_position_embeddings)
    if args.evidence:
        from ropescale.evals.advice.evidence import shipped_dict, write_shipped
        from ropescale.evals.report.cell_keys import cells_jitter, cells_runtime

        if not args.command:
            raise ValueError("--evidence needs --command: the command that reproduces the numbers")
        runtime = cells_runtime([results.parent])  # what computed the cells: a merge from another kind is refused
        jitter = cells_jitter([results.parent])  # how the passkey needles were placed: a merge of the other is refused
        shipped = shipped_dict(ev, original, args.note or ev.note, args.command, runtime=runtime, passkey_jitter=jitter)
        merged = write_shipped(args.evidence, shipped)
        print("".join(f"evidence: {line}\n" for line in merged) + f"evidence: {args.evidence}")
    for extra in args.also:
        ev = with_rows(ev, _load_any(extra))
    report = format_frontier(ev, original, args.target_length)
    if args.battery:
        from ropescale.evals.advice.battery_evidence import battery_folders
        from ropescale.evals.advice.frontier_battery import battery_section

        folders = battery_folders(
            ev.model, args.battery, shipped=False
        )  # the named ones (each format), not the shipped
        report += "\n" + "\n".join(battery_section(ev, folders, original, args.target_length))
    from ropescale._lock import writing

    with writing(results.parent / "frontier.md", "frontier report"):
        atomic_write_text(results.parent / "frontier.md", report + "\n")
    with writing(results.parent / "frontier.png", "frontier plot"):
        plot = plot_frontier(ev, original, args.target_length, results.parent / "frontier.png")
    print(report + "\n" if args.verbose else format_verdict(ev, original, args.target_length))
    where = "" if args.verbose else " (every method, its cells and the rules; --verbose prints it)"
    print(f"report: {results.parent / 'frontier.md'}{where}" + (f"\nplot:   {plot}" if plot else ""))
    return 0


def _load_any(path: str):
    """Evidence from a shipped-format file or a suite's results (folder or results.json)."""
    from ropescale.evals.advice.evidence import load_measured, load_results

    p = Path(path)
    found = load_results(p / "results.json" if p.is_dir() else p)
    if found is None:
        found = load_measured(p)  # RopescaleError names the file when it is neither
    return found


def _scaled(model: str) -> bool:
    """Whether ``model``'s checkpoint carries a scaling (its config only)."""
    from ropescale.evals.tasks.saved import carried
    from ropescale.models.loading import load_config

    return carried(load_config(model)) is not None


def _original_context(model: str, given: int | None) -> int:
    """The pretraining context L the candidates are scaled from, as the patch takes it: ``given``, or the
    model's config read by :func:`ropescale.patching.shipped.shipped_of` (the family table where config.json
    misstates it; no weights are loaded)."""
    if given:
        return given
    from ropescale.models.loading import load_config
    from ropescale.patching.shipped import shipped_of

    return shipped_of(load_config(model)).pretraining


COMMAND = Command(
    "frontier",
    help="which methods keep BOTH native perplexity and retrieval at a target length (Pareto report)",
    description="Run candidate methods at N / L on perplexity and passkey up to N, mark which keep the native "
    "model's perplexity (within 1%%) and retrieval (not shown below native at L, 95%% Wilson), and plot "
    "perplexity against retrieval.",
    add_arguments=add_arguments,
    run=run,
    epilog=EXAMPLE,
    raw=True,
)
