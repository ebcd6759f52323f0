"""Issue 54's fine-tune that extends, on 2 CPU cores: the recipe, its control, then the evaluation,
step by step and resumable over several sittings, with the evidence written as it comes.

    python benchmarks/cpu_finetune_x2.py                 # x2 (to 16k): ~5 h of training + ~2 h of evaluation
    python benchmarks/cpu_finetune_x2.py --factor 4 --steps 640 --control-from runs/cpu-x2-640steps   # x4 (to 32k) after x2
    python benchmarks/cpu_finetune_x2.py --steps 640     # both recipes twice as long: a run that did not converge
    python benchmarks/cpu_finetune_x2.py --report-only   # the report and verdict of what is measured
    python benchmarks/cpu_finetune_x2.py --dry-run       # what a run would train and measure, nothing run

Run it ALONE on the machine (no test run, build or second measurement beside it): every training log
line and every cell records the 1-minute load average it ran under, and a figure measured beside
another job is slower by its share.

Steps, each skipped where its output exists (so an interrupted run resumes; run the same command again):

1. train ``smollm2-135m/yarn_x<s>_cpu`` (``ropescale train --resume``: from its newest checkpoint),
   export it and measure its perplexity (3); 2. the same for the control
   ``smollm2-135m/yarn_x2_cpu_control``. A role trained already goes first, so its cells are committed
   before the other's hours of training;
3. perplexity of held-out *Emma* (non-overlapping windows with BOS, 4 windows of the target: 65,536
   tokens at x2) at 2k/8k and every doubling to the target: the unscaled model and the control at
   ≤ 8k, training-free YaRN ×s and the fine-tune at every length (the suites of bench_extension.py);
4. RULER's four countable tasks (``COUNTABLE`` of benchmarks/extension_cpu_goal.py), 30 prompts
   each: the fine-tune at the target, the unscaled model at 4k (its cells shipped in
   evals/measured/ruler/smollm2-135m-x4-cpu/ are taken where their fingerprint matches this machine's
   runtime, else run: ~2 min a task);
5. the goal (benchmarks/extension_cpu_goal.py) and the convergence of both held-out curves: a run whose
   curve may still fall at its last point (its windows do not exclude a fall beyond 0.25 % per 40 steps,
   ``curve_falling``) is reported "not converged", not as the recipe's result.

Evidence, written after every step into ``--ship`` (default ``evals/measured/finetune-cpu-x<s>/``,
committed between sittings): the suites' and RULER's cells, each run's training log
(``<run>-metrics.jsonl``: loss, tokens/s, held-out points, load average), ``report.md`` and
``goal.json``; and ``evals/measured/smollm2-135m-finetune-cpu-x<s>.json``, the rows
``ropescale recommend --budget fine-tune`` reads; and the prompt journals of RULER cells in progress
(``ruler/<folder>/in-progress/``, benchmarks/journals.py). Each RULER cell is committed as it is
written. Cells and journals committed there are copied back into ``--output`` before anything runs
(``--report-only`` too), so a checkout resumes its measurements from what was committed.

The checkpoints themselves, 1.6 GB a step, stay in ``--output``. A fresh checkout retrains, with the
same seed, only a role whose cells are not all committed; where its held-out curve is committed already
it evaluates the held-out text at the last step only, and the report says whether the retrain
reproduced the first run's losses and held-out windows exactly (benchmarks/fresh_checkout.py).

Training-free Self-Extend and YaRN stand beside the fine-tune on the same RULER prompts: their cells at
the target in evals/measured/ruler/smollm2-135m-x4-cpu/ are listed in the report (at ×4, which covers
16k).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
RECIPES = {2: "smollm2-135m/yarn_x2_cpu", 4: "smollm2-135m/yarn_x4_cpu"}
CONTROL_RECIPE = "smollm2-135m/yarn_x2_cpu_control"
#: the unscaled model's RULER cells measured on a CPU, and training-free YaRN's and Self-Extend's at 16k/32k
BASE_CELLS = ROOT / "evals" / "measured" / "ruler" / "smollm2-135m-x4-cpu"
#: the suites' roles, and which lengths each measures (the unscaled models only up to L)
SUITES = ("base", "finetuned", "control")
#: where the committed folder keeps the prompt journals of RULER cells in progress (benchmarks/journals.py)
IN_PROGRESS = "in-progress"


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--factor", type=int, default=2, choices=sorted(RECIPES))
    ap.add_argument("--recipe", default=None, help="the fine-tune's recipe (default: smollm2-135m/yarn_x<s>_cpu)")
    ap.add_argument("--control", default=None, help=f"the control's recipe (default: {CONTROL_RECIPE})")
    ap.add_argument(
        "--steps",
        type=int,
        default=None,
        help="train both recipes for N optimizer steps (train.max_steps=N, the cosine schedule over N) instead of "
        "the recipes' own; the folders and the evidence file are then named -<N>steps",
    )
    ap.add_argument("--output", default=None, help="runs, exports and cells (default: runs/cpu-x<s>[-<N>steps])")
    ap.add_argument(
        "--ship",
        default=None,
        help="the committed evidence folder (default: evals/measured/finetune-cpu-x<s>[-<N>steps])",
    )
    ap.add_argument(
        "--evidence", default=None, help="default: evals/measured/smollm2-135m-finetune-cpu-x<s>[-<N>steps].json"
    )
    ap.add_argument("--samples", type=int, default=30, help="prompts per RULER cell")
    ap.add_argument("--tasks", default=None, help="RULER tasks (default: the four countable ones)")
    ap.add_argument("--base-cells", default=str(BASE_CELLS), help="shipped RULER cells of the unscaled model")
    ap.add_argument("--base-length", type=int, default=4096, help="the unscaled model's RULER length (the bar)")
    ap.add_argument(
        "--control-from",
        default=None,
        metavar="DIR",
        help="the --output of an earlier experiment whose control run and export are reused (x4 after x2: "
        "runs/cpu-x2; the control is the same at every factor); trained there if not yet",
    )
    ap.add_argument(
        "--control-ship",
        default=None,
        metavar="DIR",
        help="the committed folder of the --control-from experiment, where the control's training log is "
        "(default: evals/measured/finetune-<name of --control-from> where it exists, else --ship): a "
        "fresh checkout retrains the control as that log says, and the report reads its curve there",
    )
    ap.add_argument("--report-only", action="store_true", help="run nothing; report what is measured")
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="say what a run would train and measure (from what is committed and in --output), run nothing",
    )
    return ap.parse_args(argv)


def make_plan(factor: int):
    """The protocol: perplexity at L/4, L and every doubling to the target, 4 windows of the target."""
    from extension_plan import Plan

    plan = Plan.at(factor)
    return replace(plan, ppl_max_tokens=4 * max(plan.ppl_lengths))


def overrides(args) -> list[str]:
    """The recipe overrides both runs train with: ``--steps N`` only, so the control trains as long as the
    fine-tune (a control trained less would leave the fine-tune's extra adaptation in the comparison)."""
    return [f"train.max_steps={args.steps}"] if args.steps else []


def suffix(args) -> str:
    """What names a run of other steps apart: its folders, evidence file and command."""
    return f"-{args.steps}steps" if args.steps else ""


def ropescale(*args: str, env: dict[str, str] | None = None) -> None:
    """Run ``ropescale args`` here; ``env``: variables set for it (shown in the line it prints)."""
    from fresh_checkout import env_prefix

    print(f"$ {env_prefix(env or {})}ropescale " + " ".join(args), flush=True)
    cmd = [sys.executable, "-m", "ropescale.cli.main", *args]
    subprocess.run(cmd, check=True, env={**os.environ, **(env or {}), "PYTHONSAFEPATH": "1"})


def copy_new(src: Path | list[Path], dst: Path) -> list[Path]:
    """Copy the ``*.json`` cell files of ``src`` (a folder or the files) that ``dst`` lacks (nothing is
    overwritten)."""
    copied = []
    files = src if isinstance(src, list) else sorted(src.glob("*.json")) if src.is_dir() else []
    for f in files:
        if not (dst / f.name).exists():
            dst.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dst / f.name)
            copied.append(dst / f.name)
    return copied


def ship_cells(out: Path, ship: Path) -> None:
    """Every cell of ``out`` (suites and RULER) into the committed folder; a newer cell replaces the copy."""
    from journals import copy_changed
    from journals import save as save_journals

    pairs = [(out / s / "cells", ship / "cells" / s) for s in SUITES]
    ruler = [(p / "cells", ship / "ruler" / p.name) for p in sorted((out / "ruler").glob("*")) if p.is_dir()]
    for src, dst in pairs + ruler:
        copy_changed(sorted(src.glob("*.json")) if src.is_dir() else [], dst)
    for src, dst in ruler:  # the prompts of a cell in progress: a sitting cut short keeps them
        save_journals(src, dst / IN_PROGRESS)


def seed_from_ship(out: Path, ship: Path) -> int:
    """Copy the committed cells back into ``out`` where it lacks them: measurements resume, never restart."""
    from journals import restore as restore_journals

    n = sum(len(copy_new(ship / "cells" / s, out / s / "cells")) for s in SUITES)
    for folder in sorted((ship / "ruler").glob("*")) if (ship / "ruler").is_dir() else []:
        n += len(copy_new(folder, out / "ruler" / folder.name / "cells"))
        n += len(restore_journals(folder / IN_PROGRESS, out / "ruler" / folder.name / "cells"))
    return n


def mixed_text_cells(out: Path) -> list[str]:
    """One line for each perplexity cell of ``out`` that scored more than one Austen novel. Of the ``austen``
    corpus the held-out text is Emma alone; such a cell was measured with ``budget: document`` past her into a
    training book (``extension_plan.held_out_budget``), and its number is not held-out perplexity. (Other data,
    a folder of held-out texts, may hold several documents.)"""
    from ropescale.evals.report.cell_record import load_cells

    lines = []
    for cell in (c for s in SUITES if (out / s / "cells").is_dir() for c in load_cells(out / s)):
        result, data = cell.result_json, (cell.measured.data or {}) if cell.measured else {}
        if cell.task == "perplexity" and data.get("name") == "austen" and result.get("n_documents", 1) > 1:
            lines.append(
                f"{cell.path}: scored {result['n_documents']} documents ({result.get('tokens_scored')} tokens), not "
                "Emma alone: a cell of budget: document past her; move it (and its committed copy) aside and rerun"
            )
    return lines


def run_dirs(out: Path, control_from: str | None) -> dict[str, Path]:
    """Each role's training run: under ``out``, the control under ``control_from`` where given."""
    import bench_extension as bx

    runs = {role: out / name for role, name in bx.RUN_DIRS.items()}
    if control_from:
        runs["control"] = Path(control_from) / bx.RUN_DIRS["control"]
    return runs


def log_ships(args, ship: Path) -> dict[str, Path]:
    """Where each role's training log is committed: ``ship``, but the control of ``--control-from`` (an
    earlier experiment's run) keeps its log with that experiment's evidence (``--control-ship``, default
    ``evals/measured/finetune-<its name>`` where that folder exists). Its curve, and how a fresh checkout
    retrains it, are read there: the ×4 run retrains the ×2 pair's control to the same weights."""
    from ropescale.evals.advice.evidence import CONTROL, FINE_TUNED

    control = ship
    if args.control_ship:
        control = Path(args.control_ship)
    elif args.control_from:
        theirs = ROOT / "evals" / "measured" / f"finetune-{Path(args.control_from).name}"
        control = theirs if theirs.is_dir() else ship
    return {FINE_TUNED: ship, CONTROL: control}


def ship_logs(ships: dict[str, Path], runs: dict[str, Path], retrained: frozenset[str] = frozenset()) -> None:
    """Each run's training log (loss, tokens/s, held-out points, load average) into its committed folder
    (``ships``: :func:`log_ships`); a retrain's (``retrained``: its roles) beside the first run's, never
    over it (fresh_checkout.py)."""
    from fresh_checkout import RETRAIN_LOG

    from ropescale._io import atomic_write_text

    for role, run in runs.items():
        log = run / "metrics.jsonl"
        if log.is_file():
            ship = ships[role]
            ship.mkdir(parents=True, exist_ok=True)
            name = f"{run.name}{RETRAIN_LOG}" if role in retrained else f"{run.name}-metrics.jsonl"
            atomic_write_text(ship / name, log.read_text(encoding="utf-8"))


def ppl_windows(out: Path) -> dict[tuple[str, int], dict]:
    """``(row label, length) -> perplexity cell result`` of the suites' cells in ``out``: the window NLLs
    the goal's perplexity intervals pair (``extension_cpu_goal.window_ratio``)."""
    from shipped_ppl_table import cells

    return {key: result for suite in SUITES for key, result in cells(out / suite).items()}


def ppl_suites(plan, exports: dict) -> dict[str, dict]:
    """The three suites of bench_extension without passkey: the unscaled model and the control at ≤ L."""
    from extension_plan import suite_dicts

    short = [n for n in plan.ppl_lengths if n <= plan.original_context]
    raws = suite_dicts(plan, exports["fine-tuned yarn"], exports["control"])
    for raw in raws.values():
        raw.pop("passkey", None)
        for entry in raw["methods"]:
            entry.pop("only", None)
            if entry.get("method") == "none":
                entry["only"] = {"perplexity": short}
    return raws


def report_suites(plan, out: Path, runs: dict[str, Path]) -> None:
    """Each suite's report (``results.json``, what the rows are read from) of the cells in its folder,
    nothing run: a fresh checkout holds the committed cells only, no report and no model."""
    from ropescale.evals.suite.folder import SuiteFolder
    from ropescale.evals.suite.parse import suite_from_dict

    exports = {role: run.parent / f"{run.name}-export" for role, run in runs.items()}
    for name, raw in ppl_suites(plan, exports).items():
        if (out / name / "cells").is_dir():
            SuiteFolder(suite_from_dict(raw), out / name).report()


def ruler_scores(folder: Path, label: str | None = None) -> dict[str, dict[int, tuple[float, int, list[float]]]]:
    """``{task: {length: (score, prompts, each prompt's score)}}`` of the complete plain-prompt cells in
    ``folder`` (of ``label``)."""
    from ropescale.evals.report.ruler_folder import load_ruler_cells  # either layout

    out: dict[str, dict[int, tuple[float, int, list[float]]]] = {}
    for r in load_ruler_cells(folder) if folder.is_dir() else []:
        if r.complete and r.prompt == "plain" and (label is None or r.label == label):
            records = r.result.records
            out.setdefault(r.task, {})[r.length] = (r.score, len(records), [float(x.score) for x in records])
    return out


def task_names(args) -> tuple[str, ...]:
    """The RULER tasks judged: ``--tasks`` or the four countable ones."""
    from extension_cpu_goal import COUNTABLE

    return tuple(t for t in args.tasks.split(",") if t.strip()) if args.tasks else COUNTABLE


def base_cells(folder: Path, length: int, tasks: tuple[str, ...]) -> list[Path]:
    """The shipped cells of the unscaled model on ``tasks`` at ``length``."""
    from ropescale.evals.tasks.ruler.record import load_cells

    cells = load_cells(folder) if folder.is_dir() else []
    return [r.path for r in cells if r.unscaled and r.label == "none" and r.task in tasks and r.length == length]


def free_lines(base_cells: Path, target: int, tasks) -> list[str]:
    """Training-free scalings' RULER cells at the target, on the same prompts (listed, not judged)."""
    from ropescale.evals.report.ruler_folder import load_ruler_cells  # suite cells too

    lines = []
    for r in load_ruler_cells(base_cells) if base_cells.is_dir() else []:
        if not r.unscaled and r.length == target and r.task in tasks and r.complete and r.prompt == "plain":
            k = len(r.result.records)
            lines.append(f"- {r.label} {r.task} {target // 1024}k: {100 * r.score:.1f} on {k} ({base_cells.name})")
    return sorted(lines)


def measure(args, plan, out: Path, ship: Path, recipes: dict[str, str], factor: int) -> None:
    """Steps 1-4, each skipped where its output exists."""
    import bench_extension as bx
    from extension_ruler import _emma
    from fresh_checkout import plan_lines, retrain_overrides, roles_needed, shipped_log, training_env
    from ruler_run import RulerRun

    from ropescale.evals.advice.evidence import FINE_TUNED
    from ropescale.evals.suite.folder import SuiteFolder
    from ropescale.evals.suite.parse import suite_from_dict
    from ropescale.evals.suite.runner import run_suite
    from ropescale.evals.tasks.ruler.tasks import get_task
    from ropescale.models.runtime import resolve_runtime
    from ropescale.scaling import Scaling

    try:  # a task name that is not RULER's stops before anything trains
        tasks = [get_task(t) for t in task_names(args)]
    except ValueError as exc:
        print(f"cpu_finetune_x2: --tasks: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    runs = run_dirs(out, args.control_from)
    exports = {role: run.parent / f"{run.name}-export" for role, run in runs.items()}
    runtime = resolve_runtime("auto", plan.dtype)
    essay = _emma(plan.data)
    target = int(plan.factor * plan.original_context)
    suites = {name: suite_from_dict(raw) for name, raw in ppl_suites(plan, exports).items()}
    rulers = [  # the shipped unscaled cells count as done where their fingerprint (runtime included) is this run's
        (RulerRun(m, sc, tasks, n, args.samples, out / "ruler" / f, plan.seed, runtime, essay), role)
        for m, sc, n, f, role in (
            (plan.model, Scaling("none"), [args.base_length], "none", None),
            (str(exports[FINE_TUNED]), Scaling(None), [target], "yarn", FINE_TUNED),
        )
    ]
    expected = {  # each trained role's cells: a role with all of them committed needs no model (fresh_checkout.py)
        role: [
            SuiteFolder(suites[bx.SUITE_OF[role][0]], out / bx.SUITE_OF[role][0]).cell_path(*c)
            for c in suites[bx.SUITE_OF[role][0]].cells()
        ]
        + [r.path(t.name, n) for r, of in rulers if of == role for t in tasks for n in r.lengths]
        for role in recipes
    }
    needed = roles_needed(expected)
    given = overrides(args)
    logs = log_ships(args, ship)
    extra = {role: retrain_overrides(recipe, given, runs[role], logs[role]) for role, recipe in recipes.items()}
    retrained = frozenset(role for role, more in extra.items() if more)
    envs = {  # a retrain (or a resumed run) takes the code paths its log's steps took
        role: training_env(shipped_log(logs[role], run) if role in retrained else run / "metrics.jsonl")
        for role, run in runs.items()
        if role in recipes and needed[role]
    }
    for role, recipe in recipes.items():  # a folder trained otherwise stops before anything trains
        if needed[role]:
            bx.check_recipes(runs[role].parent, {bx.SUITE_OF[role][0]}, given + extra[role], factor, {role: recipe})
    if args.dry_run:
        trained = {role: bx.trained(runs[role], recipe) for role, recipe in recipes.items()}
        print("\n".join(plan_lines(recipes, expected, needed, extra, given, trained, envs)))
        return
    # 1-3 for each role: train, export, its perplexity suite. A role trained already goes first, the recipe
    # first otherwise, so that its cells are committed before the next role's hours of training begin
    measured = set()
    for role in sorted(recipes, key=lambda role: not bx.trained(runs[role], recipes[role])):
        recipe, run = recipes[role], runs[role]
        if not needed[role]:
            print(f"{role}: every cell it is measured in is committed in {ship}; its model is not needed")
            continue
        try:  # the log is committed as it comes: even a sitting cut short keeps its held-out points
            if not bx.trained(run, recipe):
                if extra[role]:
                    print(
                        f"{role}: retraining (checkpoints are not committed); its held-out curve is, so {extra[role][0]}"
                    )
                more = given + extra[role]
                ropescale(
                    "train",
                    "--config",
                    recipe,
                    "--output-dir",
                    str(run),
                    "--resume",
                    "--no-progress",
                    *more,
                    env=envs[role],
                )
        finally:
            ship_logs(logs, runs, retrained)
        if not (exports[role] / "config.json").is_file():
            ropescale("export", str(run), "--output", str(exports[role]))
        name = bx.SUITE_OF[role][0]
        measured.add(name)
        try:
            run_suite(suites[name], out / name)
        finally:  # the cells finished so far, even when a sitting ends inside a suite
            ship_cells(out, ship)
    for name, suite in suites.items():  # 3: the untrained models' perplexity
        if name in measured or any(bx.SUITE_OF[role][0] == name and not needed[role] for role in recipes):
            continue
        try:
            run_suite(suite, out / name)
        finally:  # the cells finished so far, even when a sitting ends inside a suite
            ship_cells(out, ship)
    copy_new(base_cells(Path(args.base_cells), args.base_length, task_names(args)), out / "ruler" / "none" / "cells")
    for run, role in rulers:  # 4: RULER
        if role is not None and not needed[role]:
            continue
        run.on_cell = lambda path: ship_cells(out, ship)  # each cell committed as it is written
        try:
            run.run()
        finally:
            ship_cells(out, ship)


def evidence_status(curves: dict[str, list[dict]], parts: list, ship_name: str) -> str:
    """The evidence file's ``status``, which ``recommend --budget fine-tune`` gives as its first caveat:
    "not converged: ..." where a held-out curve may still fall, else "in progress: ..." where a goal part
    is not measured in full, else empty (converged, every part measured)."""
    from extension_cpu_goal import FALL_TOLERANCE, TOLERANCE_STEPS, curve_falling
    from extension_goal import MISSING

    said = [  # the paired-window detail is in report.md
        f"the {role} held-out curve may still fall at step {c[-1]['step']} ({c[-2]['eval_ppl']:.2f} at step "
        f"{c[-2]['step']}, {c[-1]['eval_ppl']:.2f}: a fall beyond {100 * FALL_TOLERANCE:g} % per "
        f"{TOLERANCE_STEPS} steps not excluded)"
        for role, c in curves.items()
        if curve_falling(c)[0]
    ]
    if said:
        return f"not converged: {'; '.join(said)}; not the recipe's result ({ship_name}/report.md)"
    pending = [p.part for p in parts if p.status in (MISSING, "in progress")]
    if pending:  # converged, but a part of the goal is still being measured: say so
        return f"in progress: {'; '.join(pending)}: not measured in full yet ({ship_name}/report.md)"
    return ""


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import bench_extension as bx
    from extension_cpu_goal import goal_parts, heldout_records, retrieval_line, verdict
    from extension_plan import collect, evidence_dict
    from fresh_checkout import curve_source, env_prefix, retrain_lines, training_env
    from heldout_plot import plot as plot_heldout

    from ropescale._io import atomic_write_text
    from ropescale.evals.advice.evidence import CONTROL, FINE_TUNED, write_shipped

    factor = args.factor
    recipes = {FINE_TUNED: args.recipe or RECIPES[factor], CONTROL: args.control or CONTROL_RECIPE}
    out = Path(args.output or f"runs/cpu-x{factor}{suffix(args)}")
    ship = Path(args.ship or ROOT / "evals" / "measured" / f"finetune-cpu-x{factor}{suffix(args)}")
    evidence = Path(
        args.evidence or ROOT / "evals" / "measured" / f"smollm2-135m-finetune-cpu-x{factor}{suffix(args)}.json"
    )
    plan = make_plan(factor)
    seeded = seed_from_ship(out, ship)  # also for the report: a fresh checkout has what was committed only
    if seeded:
        print(f"resumed {seeded} committed cells and journals from {ship}")
    mixed = mixed_text_cells(out)  # before any weights load: none of them may be judged or resumed
    if mixed:
        print("\n".join(f"cpu_finetune_x2: {line}" for line in mixed), file=sys.stderr)
        return 2
    if not args.report_only:
        measure(args, plan, out, ship, recipes, factor)
    if args.dry_run:
        return 0
    report_suites(plan, out, run_dirs(out, args.control_from))
    steps = f" --steps {args.steps}" if args.steps else ""
    runs = run_dirs(out, args.control_from)
    # the opt-in code paths the trainings took, from the logs their curves are read from
    logs = log_ships(args, ship)
    paths = {k: v for role, run in runs.items() for k, v in training_env(curve_source(logs[role], run)).items()}
    command = f"{env_prefix(paths)}python benchmarks/cpu_finetune_x2.py --factor {factor}{steps} --output {out}"
    rows = collect(out, {role: command for role in ("none", "yarn", FINE_TUNED, CONTROL)})
    # the committed logs (a fresh checkout has no runs/; a retrain's log holds its last point only)
    curves = {role: heldout_records(curve_source(logs[role], runs[role])) for role in (FINE_TUNED, CONTROL)}
    target = int(plan.factor * plan.original_context)
    ruler_ft = ruler_scores(out / "ruler" / "yarn")
    ruler_base = ruler_scores(out / "ruler" / "none", "none")
    tasks = task_names(args)
    parts = goal_parts(
        rows, plan.original_context, target, ruler_ft, ruler_base, curves, tasks, args.base_length, ppl_windows(out)
    )
    ship.mkdir(parents=True, exist_ok=True)
    atomic_write_text(ship / "goal.json", json.dumps([asdict(p) for p in parts], indent=1) + "\n")
    drawn = {role: c for role, c in curves.items() if c}
    if drawn:  # both held-out curves and their step-to-step changes, as the rule reads them
        plot_heldout(
            drawn,
            ship / "heldout.png",
            f"SmolLM2-135M-Instruct: YaRN ×{factor} fine-tune and its control, held-out Emma",
        )
    by = {r.label: r for r in rows}
    text = [
        f"# The CPU fine-tune at YaRN ×{factor} on SmolLM2-135M-Instruct (issue 54)",
        "",
        f"Command: `{command}` (recipes {recipes[FINE_TUNED]}, {recipes[CONTROL]})",
        "",
        "Held-out Emma perplexity (non-overlapping windows with BOS):",
        *(
            f"- {role}: " + ", ".join(f"{n // 1024}k {by[role].ppl[n]:.3f}" for n in sorted(by[role].ppl))
            for role in ("none", "yarn", FINE_TUNED, CONTROL)
            if role in by
        ),
        "",
        "Held-out curves during training (fine-tune at its target, control at L; load average beside):",
        *(
            f"- {role}: "
            + ", ".join(f"{p['step']}: {p['eval_ppl']:.3f} (load {p.get('load_avg', '?')})" for p in curve)
            for role, curve in curves.items()
            if curve
        ),
        *(
            [
                "",
                "![held-out curves](heldout.png) (right: each point's paired change of window NLL with its 95 % t interval, and the tolerance)",
            ]
            if drawn
            else []
        ),
        *(["", "Retrained (benchmarks/fresh_checkout.py):", *again] if (again := retrain_lines(logs, runs)) else []),
        "",
        f"RULER ({', '.join(tasks)}; % found):",
        *(
            f"- fine-tuned yarn {t} {n // 1024}k: {100 * s:.1f} on {k}"
            for t, c in ruler_ft.items()
            for n, (s, k, _) in c.items()
        ),
        *(
            f"- none {t} {n // 1024}k: {100 * s:.1f} on {k}"
            for t, c in ruler_base.items()
            for n, (s, k, _) in c.items()
        ),
        "",
        "Training-free beside it, same prompts (listed, not judged):",
        *free_lines(Path(args.base_cells), target, tasks),
        "",
        "Goal (benchmarks/extension_cpu_goal.py):",
        *(p.line() for p in parts),
        verdict(parts),
    ]
    atomic_write_text(ship / "report.md", "\n".join(text) + "\n")
    print("\n".join(text))
    if by.get(FINE_TUNED):
        machine, runtime = bx.measured_on(out, None)
        note = (  # written once (a merge keeps the file's note): the verdict lives in report.md and goal.json
            f"the CPU fine-tune of issue 54 (benchmarks/cpu_finetune_x2.py, docs/finetuning.md): SmolLM2-135M-Instruct "
            f"(L = 8,192) on {machine}; PPL: non-overlapping windows of held-out Emma with BOS; no passkey cells "
            f"(RULER's countable tasks instead); the goal, RULER, both held-out curves and the convergence verdict: "
            f"{ship.name}/report.md and goal.json; control = the same fine-tune without scaling"
        )
        status = evidence_status(curves, parts, ship.name)
        free = ruler_scores(Path(args.base_cells), f"yarn-x{factor}")  # its scaling untrained, same prompts
        retrieval = retrieval_line(
            ruler_ft, ruler_base, free, target, f"training-free yarn ×{factor}", tasks, args.base_length
        )
        for line in write_shipped(evidence, evidence_dict(rows, plan, note, runtime, status, retrieval)):
            print(f"evidence: {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
