"""``ropescale search``: calibrate LongRoPE factors (YaRN's parameters, or an attention-level method's) for a
model and target length, on perplexity or on needle retrieval."""

from __future__ import annotations

import argparse

from ropescale import options
from ropescale.cli.command import Command
from ropescale.cli.common import add_model_args, add_runtime_args
from ropescale.options import from_arguments
from ropescale.search.options import SearchOptions, baselines_for

EXAMPLES = """examples:
  ropescale search --target-length 32768 --output runs/search-32k                      # LongRoPE, eval at 32k
  ropescale search --target-length 32768 --eval-length 4096 --layout spread --budget 16 --output runs/s
  ropescale search --model ./llama --target-length 16384 --method yarn --data ./calib.txt --heldout-data ./held.txt
  ropescale search --target-length 16384 --method self_extend --objective needle --needles 3 --output runs/se
  ropescale patch --from-search runs/search-32k --output ./smollm2-32k               # use the result

Re-run the same command to resume; every evaluated candidate is in DIR/history.json.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    options.add_arguments(p, SearchOptions)  # every option of the search, its default and help, from the dataclass
    add_runtime_args(p)
    p.add_argument(
        "--output", required=True, metavar="DIR", help="results folder (resumed when it holds the same search)"
    )
    p.add_argument("--overwrite", action="store_true", help="discard an earlier search in DIR")
    p.add_argument("--no-progress", action="store_true")


def run(args: argparse.Namespace) -> int:
    import time

    from ropescale.search import run_search_job

    options = from_arguments(SearchOptions, args, baselines=baselines_for(args.baselines, args.method))
    start = time.time()
    from ropescale._lock import output_lock

    _check_results_folder(args.output, options, args.overwrite)
    with output_lock(args.output, "results folder"):  # one search per results folder
        report = run_search_job(options, args.output, overwrite=args.overwrite, progress=not args.no_progress)
    from ropescale.search.artifacts import markdown_report

    print(markdown_report(report))
    plot = ", factors.png" if report["settings"]["method"] in ("longrope", "yarn") else ""
    print(
        f"wrote {args.output}/config.json (rope_parameters: {report['settings']['method']}), best.json, history.json, "
        f"report.md{plot} in {time.time() - start:.0f} s"
    )
    return 0


def _check_results_folder(output: str, options, overwrite: bool) -> None:
    """Before any model loads: a history of a newer ropescale is refused (never rewritten), and
    ``--overwrite`` clears only a folder a search wrote (it holds history.json) that is none of the
    inputs (a model folder given as --output would lose its config.json)."""
    from pathlib import Path

    from ropescale._lock import refuse_overwriting_inputs
    from ropescale.errors import RopescaleError
    from ropescale.search.engine import read_history
    from ropescale.search.pipeline import HISTORY, OUR_FILES

    out = Path(output).expanduser()
    if (out / HISTORY).is_file():
        read_history(out / HISTORY)
    if not overwrite:
        return
    inputs = {"model": options.model, "data": options.data, "held-out data": options.heldout_data}
    refuse_overwriting_inputs(output, inputs, replaced_inside=False)  # only our files in it are removed
    ours = [name for name in OUR_FILES if (out / name).exists()]
    if ours and not (out / HISTORY).is_file():
        raise RopescaleError(
            f"--output '{output}' holds {ours[0]} but no {HISTORY}: not a results folder a search wrote; "
            "--overwrite removes only those: choose another --output"
        )


COMMAND = Command(
    "search",
    help="search per-pair RoPE factors (LongRoPE), YaRN's or an attention-level method's parameters for a model "
    "and target length",
    description="Search, for this model and target length, the per-pair rescale factors of LongRoPE (or "
    "YaRN's beta_fast/beta_slow/attention factor, or Self-Extend's, DCA's or STRING's parameters on a grid) that "
    "minimise perplexity (or the answer-token NLL of needle prompts) on a calibration text, seeded "
    "with PI, NTK and YaRN (or the method's defaults); report on a different (held-out) text. Writes DIR/config.json (rope_parameters "
    "that plain transformers reads), DIR/best.json, DIR/history.json, DIR/report.md and DIR/factors.png.",
    add_arguments=add_arguments,
    run=run,
    epilog=EXAMPLES,
    raw=True,
)
