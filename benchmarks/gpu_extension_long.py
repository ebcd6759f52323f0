"""Issue 41's experiment on one GPU: the long fine-tunes (code + books, 40 % short windows, recall in
non-passkey forms) at ×4 and ×8, each beside its control, with both held-out curves, perplexity, passkey
and RULER's battery, and the goal judged part by part (benchmarks/bench_extension.py --recipe ...).

    python benchmarks/gpu_extension_long.py --output "$OUT"           # ×4 then ×8, one H100/H200
    python benchmarks/gpu_extension_long.py --output "$OUT" --factors 4   # ×4 only
    python benchmarks/gpu_extension_long.py --estimate                  # the expected time, nothing run

Resumable: run the same command again after an interruption (a kill, a time limit) and every finished
step is kept (trainings from their newest checkpoint, exports, suite and RULER cells, a cell cut short
from its first undecoded prompt). Each factor writes ``OUTPUT/x<s>/`` (report.md, goal.json, plots,
the runs) and the evidence file ``OUTPUT/smollm2-135m-finetune-long-x<s>-jitter.json`` in the shipped
format (copy it to evals/measured/ to ship it).

Before anything runs, every source of the recipes must be on this machine (``make setup`` installs
Austen and the King James Bible; the standard library's tree is the interpreter's) and the embedded
model must load: one line names what is missing.

Expected time on one H100 (``--estimate`` prints it): the 400-step pairs of the Austen experiments took
about 5 minutes a pair with their suites; these recipes add tokenizing the mix once per run folder
(the stdlib tree, ~7.7M tokens, about a minute each), 8 held-out evaluations per run (seconds), and
RULER's tasks at 30 prompts a cell (the fine-tune at every length from 8k to the target, the unscaled
model and the control at 8k), decoded greedily until the answer is complete or 128 new tokens: at most
about 1 s a prompt at 32k for a 135M model. An H200 is about as fast for a model this small. Not yet run
on a GPU.

RULER's tasks: by default those the unscaled model can do, from its CPU cells shipped in
evals/measured/ruler/smollm2-135m-x4-cpu/ (the battery's six and the ``[austen]`` variants measured there;
at 4k: ``niah_single_1`` and the five ``[austen]`` needle tasks). A task the unscaled model scores below
0.3 at ≤ L (``niah_multikey_2/3``, ``vt``, ``cwe``, ``fwe``) is beyond it: issue 40's goal reports it and
does not count it, so the GPU does not decode it (the script names each one it leaves out).
``--ruler-tasks all`` runs the battery's six. With the six countable tasks the x4 experiment is estimated
at ~22 min, above a 15-minute device lease: there, ``--ruler-tasks
niah_single_1,niah_single_2[austen],niah_multikey_1[austen]`` (one task per skill: a needle in a
repeated haystack, in prose, among distractor keys) brings it to ~15 min at the estimate's 1 s a prompt,
less where answers stop early.

On a machine lent with a per-command time limit (10 minutes) and a warm period between commands, run
the experiment into an ignored folder that stays between commands and copy what came out each time::

    timeout 540 python benchmarks/gpu_extension_long.py --output runs/gpu-long --factors 4; \
        cp -r runs/gpu-long/*.json runs/gpu-long/x4/report.md runs/gpu-long/x4/goal.json "$OUT"/ 2>/dev/null

and the same command again until it prints ``x4: done``; a kill is an interruption like any other.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPES = {4: "smollm2-135m/yarn_x4_long", 8: "smollm2-135m/yarn_x8_long"}
#: minutes on one H100: a 400-step pair with its suites (measured for the Austen recipes), tokenizing
#: the mix in each of the two run folders, and seconds per RULER prompt (an estimate, not measured)
PAIR_MIN, TOKENIZE_MIN, RULER_S = {4: 5.0, 8: 6.0}, 1.0, 1.0
SAMPLES = 30
#: the unscaled model's RULER cells, measured on a CPU (docs/experiments/2026-11-28-battery-x4-cpu.md)
BASE_CELLS = ROOT / "evals" / "measured" / "ruler" / "smollm2-135m-x4-cpu"


def ruler_prompts(factor: int, tasks: int = 6) -> int:
    """Prompts the RULER part decodes at ×``factor``: the fine-tune at L and every doubling to factor·L,
    the unscaled model and the control at L."""
    return tasks * SAMPLES * (int(factor).bit_length() + 2)  # bit_length: L, 2L, ..., factor·L


def estimate_minutes(factor: int, tasks: int = 6) -> float:
    return PAIR_MIN[factor] + 2 * TOKENIZE_MIN + ruler_prompts(factor, tasks) * RULER_S / 60


def countable_tasks(folder: Path | None = None) -> tuple[list[str], dict[str, float]]:
    """The RULER tasks to decode, and those left out with the unscaled model's score (0-1).

    The candidates are the battery's six and every other task the unscaled model has a cell of in
    ``folder`` (the ``[austen]`` variants: the essay-haystack tasks on held-out *Emma*).

    A task whose unscaled score (the mean of its cells at lengths ≤ L in ``folder``) is below 30 % is
    beyond the model at any length (``recommend``'s rule, :meth:`~ropescale.evals.advice.battery_evidence.Folder.beyond`):
    the goal reports it and does not count it, so the GPU does not decode it. A task with no such cell
    is kept (nothing says it is beyond the model).
    """
    from extension_ruler import BATTERY

    from ropescale.evals.advice.battery_evidence import read_folder

    folder = BASE_CELLS if folder is None else folder
    cells = read_folder(folder, "smollm2-135m") if folder.is_dir() else None
    base = cells.base() if cells else {}
    beyond = {task: base[task][0] / 100 for task in cells.beyond()} if cells else {}
    candidates = list(BATTERY) + sorted(t for t in base if t not in BATTERY)  # e.g. the [austen] variants
    return [t for t in candidates if t not in beyond], beyond


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--output", default=os.environ.get("OUT", "runs/gpu-extension-long"))
    ap.add_argument("--factors", default="4,8", help="which experiments, in order (4, 8 or both)")
    ap.add_argument("--jitter", type=float, default=0.125, help="passkey placement (as the shipped GPU runs)")
    ap.add_argument(
        "--ruler-tasks",
        default=None,
        help="RULER tasks (default: the battery's six but those the unscaled model cannot do, from its CPU cells; "
        "'all': the six)",
    )
    ap.add_argument("--estimate", action="store_true", help="print the expected time and stop")
    return ap.parse_args(argv)


def preflight(factors: list[int]) -> None:
    """Stop (status 2, one line) where a recipe's source or the model is missing, before anything runs."""
    from ropescale.data.sources import describe_source, parse_sources
    from ropescale.errors import RopescaleError
    from ropescale.training.config import load_config

    for factor in factors:
        config = load_config(RECIPES[factor])
        for spec in parse_sources(config.data.sources):
            try:
                found = describe_source(spec)
            except (RopescaleError, OSError) as exc:
                raise SystemExit(f"gpu_extension_long: {RECIPES[factor]}: source {spec.source}: {exc}") from None
            if not found.get("bytes"):
                raise SystemExit(f"gpu_extension_long: {RECIPES[factor]}: source {spec.source}: {found['note']}")


def main(argv=None) -> int:
    args = parse_args(argv)
    factors = [int(f) for f in args.factors.split(",") if f]
    if set(factors) - set(RECIPES):
        raise SystemExit(f"gpu_extension_long: --factors {args.factors!r}: 4, 8 or both")
    if args.ruler_tasks is None:
        tasks, beyond = countable_tasks()
        for task, score in beyond.items():
            print(
                f"RULER {task}: not run (the unscaled model scores {score:.0%} at <= L, {BASE_CELLS.name}: beyond it)"
            )
    else:
        from extension_ruler import BATTERY

        tasks = list(BATTERY) if args.ruler_tasks == "all" else [t for t in args.ruler_tasks.split(",") if t.strip()]
    n = len(tasks)
    for f in factors:
        print(f"x{f}: expected ~{estimate_minutes(f, n):.0f} min on one H100 ({ruler_prompts(f, n)} RULER prompts)")
    print(f"total: ~{sum(estimate_minutes(f, n) for f in factors):.0f} min; resumable: rerun the same command")
    if args.estimate:
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    preflight(factors)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_extension

    out = Path(args.output)
    for f in factors:
        start = time.perf_counter()
        evidence = out / f"smollm2-135m-finetune-long-x{f}-jitter.json"
        argv = ["--recipe", RECIPES[f], "--output", str(out / f"x{f}"), "--jitter", f"{args.jitter:g}"]
        argv += ["--ruler-tasks", ",".join(tasks)]
        bench_extension.main([*argv, "--skip-curve", "--evidence", str(evidence)])
        print(f"x{f}: done in {(time.perf_counter() - start) / 60:.1f} min (estimated {estimate_minutes(f, n):.0f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
