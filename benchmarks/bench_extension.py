"""Does fine-tuning extend? Train, export and measure the four models of the extension experiment,
resumably; print the table, the goal's verdict and write the plots and the evidence file.

    python benchmarks/bench_extension.py                         # everything (hours on 2 CPU cores)
    python benchmarks/bench_extension.py --passkey-lengths 4096,8192   # the short cells first
    python benchmarks/bench_extension.py --report-only           # table and plots of what is measured
    python benchmarks/bench_extension.py --factor 8 --jitter 0.125 --output runs/extension-x8   # x8 (64k), spread needles
    python benchmarks/bench_extension.py --curve-tasks perplexity,passkey   # each checkpoint's retrieval too
    python benchmarks/bench_extension.py --output runs/extension-x4-contiguous4k --suites finetuned \
        --overrides pose.enabled=false data.seq_len=4096 train.grad_accum=1   # a variant of the fine-tune
    python benchmarks/bench_extension.py --recipe smollm2-135m/yarn_x4_long --output runs/extension-x4-long \
        --jitter 0.125 --skip-curve     # issue 41: the mixed-data recipe, its held-out curves and RULER

Models (benchmarks/extension_plan.py): the embedded SmolLM2-135M-Instruct as trained (``none``), with
training-free YaRN ×4 (``yarn``), fine-tuned at YaRN ×4 by ``configs/train/smollm2-135m/yarn_x4.yaml``
(``fine-tuned yarn``), and fine-tuned by ``yarn_x4_control.yaml`` (``control``: the same text, windows,
steps and optimizer, no scaling, positions within 8192). Every model is measured by the same suites:
perplexity of held-out *Emma* (non-overlapping windows, BOS) at 2k/8k/16k/32k and passkey at
4k/8k/16k/32k over depths 0/0.25/0.5/0.75/1 × 6 (30 prompts per length; the unscaled models only up
to 8k). The gain curve: perplexity of every saved checkpoint at 32k (fine-tuned) and 8k (control).

``--recipe`` names another fine-tune (its factor is the recipe's; its control is ``CONTROLS[recipe]``,
else the recipe's ``_control`` sibling). Each fine-tune's held-out curve is read from its run's
``metrics.jsonl`` (recipes with ``eval.every``), and with ``--recipe`` (or ``--ruler-tasks``) RULER's
battery (benchmarks/extension_ruler.py) runs on the unscaled model and the control at L and on the fine-tune
from L to its target, unless ``--skip-ruler``; the goal of issue 41 is then judged part by part
(benchmarks/extension_goal.py).

Every step resumes: training from its newest complete checkpoint, exports and curve points are kept,
suite cells are kept and an interrupted passkey cell resumes at its first unfinished prompt.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

from ropescale.evals.advice.evidence import CONTROL, FINE_TUNED

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the drivers beside it, run from anywhere
from extension_curve import curve, curve_text, plot  # noqa: E402 - the gain curve and the report's figures
from extension_plan import ROLES, RUN_DIRS, SUITE_OF  # noqa: E402

#: the fine-tune's recipe per factor; the control (no scaling, positions within 8192) is the same at every factor
SCALED = {4: "smollm2-135m/yarn_x4", 8: "smollm2-135m/yarn_x8"}
RECIPES = {FINE_TUNED: SCALED[4], CONTROL: "smollm2-135m/yarn_x4_control"}
#: the control of each shipped fine-tune recipe (others: the recipe's ``_control`` sibling)
CONTROLS = {
    SCALED[4]: RECIPES[CONTROL],
    SCALED[8]: RECIPES[CONTROL],
    "smollm2-135m/yarn_x4_long": "smollm2-135m/yarn_x4_long_control",
    "smollm2-135m/yarn_x8_long": "smollm2-135m/yarn_x4_long_control",
}
BASELINES_HELP = """shipped evidence (evals/measured/...) whose none and yarn rows stand for the base suite, not run then
(a variant measuring only its fine-tunes; the file's model, factor, passkey placement and runtime are checked)"""


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--output", default="runs/extension-x4", help="runs, exports, suites and report")
    ap.add_argument("--factor", type=int, default=None, choices=sorted(SCALED), help="YaRN factor (x8: to 64k)")
    ap.add_argument("--recipe", default=None, help="the fine-tune's recipe (default: smollm2-135m/yarn_x<factor>)")
    ap.add_argument("--skip-ruler", action="store_true", help="no RULER cells (benchmarks/extension_ruler.py)")
    ap.add_argument(
        "--ruler-tasks",
        default=None,
        help="RULER tasks (default: the battery's six); RULER runs with --recipe or --ruler-tasks, not for the "
        "shipped Austen pair's commands, which measured none",
    )
    ap.add_argument("--ruler-samples", type=int, default=30, help="prompts per RULER cell (default 30)")
    ap.add_argument(
        "--passkey-lengths", default=None, help="passkey cells to run now (default: all, 4k to factor x 8k)"
    )
    ap.add_argument("--ppl-lengths", default=None, help="default: 2k, 8k and every doubling to factor x 8k")
    ap.add_argument(
        "--jitter",
        type=float,
        default=0.0,
        help="passkey placement: each trial's depth drawn from depth +- JITTER (e.g. 0.125; docs/evaluation.md); "
        "0 (default): the fixed depths of the shipped cells. A jittered experiment needs its own --output",
    )
    ap.add_argument("--skip-curve", action="store_true", help="no per-checkpoint perplexity")
    ap.add_argument("--curve-only", action="store_true", help="train, export and the curve; no suites")
    ap.add_argument(
        "--curve-tasks",
        default="perplexity",
        help="what each checkpoint is measured on: perplexity, passkey (the shortest passkey length, the "
        "suites' prompts) or both, comma-separated",
    )
    ap.add_argument("--report-only", action="store_true", help="run nothing; report what is measured")
    ap.add_argument("--evidence", default=None, help="also write the evidence JSON here (evals/measured/...)")
    ap.add_argument("--note", default=None, help="with --evidence: appended to the file's protocol note")
    ap.add_argument(
        "--machine",
        default=None,
        help="the machine that measured the cells, for the evidence note (default: this one; required to "
        "report GPU cells from a machine without that GPU)",
    )
    ap.add_argument("--baselines", metavar="FILE", help=BASELINES_HELP)
    ap.add_argument(
        "--suites",
        default="base,finetuned,control",
        help="which suites to run (base: none and training-free yarn); only their models are trained",
    )
    ap.add_argument(
        "--overrides",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="recipe overrides for both fine-tunes, scaling.* for the scaled one only (a variant of the "
        "experiment: use its own --output)",
    )
    return ap.parse_args(argv)


def ropescale(*args: str) -> None:
    cmd = [sys.executable, "-m", "ropescale.cli.main", *args]
    print("$ ropescale " + " ".join(args), flush=True)
    # Safe path: `-m` would put the working directory first on sys.path, and in a checkout with ropescale
    # installed from a wheel, the checkout's ropescale/ (which holds no cli/) would hide the installed one.
    subprocess.run(cmd, check=True, env={**os.environ, "PYTHONSAFEPATH": "1"})


def fail(message: str) -> None:
    print(f"bench_extension: {message}", file=sys.stderr)
    raise SystemExit(2)


def measured_on(out: Path, machine: str | None) -> tuple[str, dict[str, str] | None]:
    """The evidence note's machine (``machine`` if given, else this one as the cells' runtimes name it)
    and the runtime that computed the cells (:func:`~ropescale.evals.report.cell_keys.cells_runtime`).

    Exits (status 2) when the cells come from more than one runtime, or from a GPU that this machine
    does not have and ``--machine`` does not name."""
    from ropescale.errors import RopescaleError
    from ropescale.evals.report.cell_keys import cells_runtime

    try:
        runtime = cells_runtime(sorted(p for p in out.iterdir() if (p / "cells").is_dir()))
    except RopescaleError as exc:
        fail(f"{out}: {exc}")
    recorded = runtime or {}
    dtype = recorded.get("dtype", "auto")
    if machine:
        return f"{machine} ({dtype})", runtime
    if recorded.get("device", "cpu").startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            fail(f"{out}: cells measured on a GPU that this machine does not have; name it with --machine")
        return f"one {torch.cuda.get_device_name()} ({dtype})", runtime
    from ropescale.models.runtime import cpu_bf16_kernels

    kernels = f" on {recorded.get('kernels') or cpu_bf16_kernels()}" if dtype == "bfloat16" else ""
    return f"{os.cpu_count()} CPU cores, auto precision ({dtype}{kernels})", runtime


def with_baselines(out: Path, rows: list, path: str, plan, before: bool = False) -> tuple[list, list[str]]:
    """``rows`` with the ``none``/``yarn`` rows of the shipped file ``path`` where ``out`` has none of its own,
    in the table's order, and the labels taken. Exits (2, one line) where the file is of another model, factor,
    passkey placement or runtime (``baseline_rows``): that of ``out``'s cells, else (``before`` training) this machine's."""
    from extension_plan import baseline_rows

    from ropescale.errors import RopescaleError
    from ropescale.evals.report.cell_keys import cells_runtime
    from ropescale.models.runtime import resolve_runtime

    try:
        folders = sorted(p for p in out.iterdir() if (p / "cells").is_dir()) if out.is_dir() else []
        runtime = (cells_runtime(folders) if folders else None) or (resolve_runtime().to_dict() if before else None)
        extra = [r for r in baseline_rows(path, plan, runtime) if r.label not in {r.label for r in rows}]
    except RopescaleError as exc:  # mixed cells name two runtimes; the file's faults name the file
        fail(f"--baselines: {exc}")
    return sorted([*rows, *extra], key=lambda r: ROLES.index(r.label)), [r.label for r in extra]


def trained(run: Path, recipe: str) -> bool:
    """Whether ``run`` holds a complete checkpoint at the step its recipe (as it ran) trains to."""
    from ropescale.training.checkpoints import list_checkpoints
    from ropescale.training.config import load_run_config

    done = list_checkpoints(run) if (run / "config.yaml").is_file() else []
    return bool(done) and int(done[-1].name.split("-")[1]) >= load_run_config(run).train.max_steps


def check_factor(out: Path, factor: int) -> None:
    """Stop when ``out`` holds a fine-tune trained at another factor (its cells would be read as this one's)."""
    from ropescale.training.config import load_run_config

    run = out / RUN_DIRS[FINE_TUNED]
    if (run / "config.yaml").is_file():
        trained_at = load_run_config(run).scaling.factor
        if float(trained_at) != float(factor):
            fail(
                f"{run / 'config.yaml'}: scaling.factor {trained_at:g} was trained there, --factor {factor} asked; give another --output"
            )


def recipes_for(factor: int | None = 4, recipe: str | None = None) -> dict[str, str]:
    """Each fine-tune's recipe: the shipped pair at ``factor`` (no factor given: x4, as the command line
    defaults), or ``recipe`` and its control."""
    if recipe is None:
        return {**RECIPES, FINE_TUNED: SCALED[factor or 4]}
    if recipe in CONTROLS:
        return {FINE_TUNED: recipe, CONTROL: CONTROLS[recipe]}
    stem, dot, ext = recipe.rpartition(".") if recipe.endswith((".yaml", ".yml")) else (recipe, "", "")
    return {FINE_TUNED: recipe, CONTROL: f"{stem}_control{dot}{ext}"}


def recipe_factor(recipe: str, factor: int | None) -> int:
    """The factor a ``--recipe`` trains at; exits (2, one line) where ``--factor`` asks another."""
    from ropescale.errors import RopescaleError
    from ropescale.training.config import load_config

    try:
        trained_at = load_config(recipe).scaling.factor
    except RopescaleError as exc:
        fail(f"--recipe {recipe}: {exc}")
    if factor is not None and float(factor) != float(trained_at):
        fail(f"--recipe {recipe}: scaling.factor {trained_at:g}, --factor {factor} asked")
    return int(trained_at)


def export_dirs(out: Path) -> dict[str, Path]:
    """Where each fine-tune's exported model lives."""
    return {role: out / f"{RUN_DIRS[role]}-export" for role in RECIPES}


def role_overrides(role: str, overrides: list[str]) -> list[str]:
    """What reaches ``role``'s recipe: ``scaling.*`` only the scaled fine-tune (its control has no scaling to
    set: the same data, windows and steps, unscaled), every other key both."""
    return [o for o in overrides if role == FINE_TUNED or not o.startswith("scaling.")]


def check_recipes(
    out: Path, suites: set[str], overrides: list[str], factor: int | None = 4, recipes: dict[str, str] | None = None
) -> None:
    """Stop (status 2) before anything trains when a recipe refuses its overrides, or when ``out`` holds a
    run trained with another recipe, steps included (its cells would be reported under this command)."""
    from ropescale.errors import RopescaleError
    from ropescale.training.checkpoints import recipe_difference
    from ropescale.training.config import load_config

    for role, recipe in (recipes or recipes_for(factor)).items():
        if SUITE_OF[role][0] not in suites:
            continue
        given = role_overrides(role, overrides)
        asked = f"{recipe}" + (f" with --overrides {shlex.join(given)}" if given else "")
        run = out / RUN_DIRS[role]
        differs = None
        try:  # recipe_difference loads the recipe with its overrides; a fresh folder has only the recipe to check
            if (run / "config.yaml").is_file():
                differs = recipe_difference(run, recipe, given)
            else:
                load_config(recipe, given)
        except RopescaleError as exc:
            fail(f"{asked}: {exc}")
        if differs:
            fail(f"{run / 'config.yaml'}: trained otherwise than {asked} ({differs}); give another --output")


def train_and_export(
    out: Path, suites: set[str], overrides: list[str], factor: int | None = 4, recipes: dict[str, str] | None = None
) -> dict[str, Path]:
    """Train and export the fine-tunes the chosen suites measure (the others' paths are returned as well)."""
    exports = export_dirs(out)
    for role, recipe in (recipes or recipes_for(factor)).items():
        if SUITE_OF[role][0] not in suites:
            continue
        run = out / RUN_DIRS[role]
        if not trained(run, recipe):
            given = role_overrides(role, overrides)
            ropescale("train", "--config", recipe, "--output-dir", str(run), "--resume", "--no-progress", *given)
        if not (exports[role] / "config.json").is_file():
            ropescale("export", str(run), "--output", str(exports[role]))
    return exports


def make_plan(factor: int, jitter: float):
    """The experiment's protocol at ``factor`` (the shipped lengths and prompts; tests give a tiny one)."""
    from extension_plan import Plan

    return Plan.at(factor, jitter=jitter)


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from extension_goal import goal_parts, heldout_curve, verdict
    from extension_plan import collect, evidence_dict, goal_lines, render_table, suite_dicts
    from extension_ruler import BATTERY, ruler_lines, ruler_runs, ruler_scores

    from ropescale._io import atomic_write_text
    from ropescale.evals.advice.evidence import write_shipped
    from ropescale.evals.suite.runner import run_suite, suite_from_dict
    from ropescale.evals.tasks.ruler.tasks import get_task
    from ropescale.models.runtime import resolve_runtime

    out = Path(args.output)
    factor = recipe_factor(args.recipe, args.factor) if args.recipe else args.factor or 4
    recipes = recipes_for(factor, args.recipe)
    plan = make_plan(factor, args.jitter)
    if args.ppl_lengths:
        plan = replace(plan, ppl_lengths=tuple(int(x) for x in args.ppl_lengths.split(",")))
    tasks = tuple(t for t in args.curve_tasks.split(",") if t)
    if set(tasks) - {"perplexity", "passkey"} or not tasks:  # before anything trains
        fail(f"--curve-tasks {args.curve_tasks!r}: perplexity, passkey or both")
    check_factor(out, factor)
    ruler_tasks = [t for t in (args.ruler_tasks or ",".join(BATTERY)).split(",") if t.strip()]
    try:  # a task name that is not RULER's stops before anything trains
        [get_task(t) for t in ruler_tasks]
    except ValueError as exc:
        fail(f"--ruler-tasks: {exc}")
    exports = export_dirs(out)
    suites = {x for x in args.suites.split(",") if x}
    if args.baselines:  # the file stands for the base suite; one that cannot stops before anything trains
        suites.discard("base")
        with_baselines(out, [], args.baselines, plan, before=not args.report_only)
    points = []
    if not args.report_only:
        check_recipes(out, suites, args.overrides, factor, recipes)
        exports = train_and_export(out, suites, args.overrides, factor, recipes)
        if not args.skip_curve:
            points = curve(out, plan, suites, tasks)
        wanted = {int(x) for x in (args.passkey_lengths or "").split(",") if x} or set(plan.passkey_lengths)
        raws = suite_dicts(plan, exports[FINE_TUNED], exports[CONTROL])
        for name, raw in [] if args.curve_only else [(k, v) for k, v in raws.items() if k in suites]:
            for entry in raw["methods"]:  # the cells asked for now; the rest resume on a later run
                only = entry.setdefault("only", {})
                only["passkey"] = sorted(wanted & set(only.get("passkey", plan.passkey_lengths)))
            run_suite(suite_from_dict(raw), out / name)
        if (args.recipe or args.ruler_tasks) and not (args.curve_only or args.skip_ruler):
            runtime = resolve_runtime("auto", plan.dtype)
            for run in ruler_runs(out, plan, exports, suites, ruler_tasks, args.ruler_samples, runtime).values():
                run.run()
    else:  # the suites' reports of their finished cells and, marked in progress, the partial ones
        from ropescale.evals.suite.runner import SuiteRunner

        for name, raw in suite_dicts(plan, exports[FINE_TUNED], exports[CONTROL]).items():
            if (out / name / "cells").is_dir():
                SuiteRunner(suite_from_dict(raw), out / name, progress=False).report()
        points = [json.loads(p.read_text()) for p in sorted((out / "curve").glob("*.json"))]
    variant = f" --recipe {args.recipe}" if args.recipe else f" --factor {factor}" if factor != 4 else ""
    variant += f" --jitter {args.jitter:g}" if args.jitter else ""
    variant += f" --overrides {shlex.join(args.overrides)}" if args.overrides else ""  # as a shell reads it back
    commands = {role: f"python benchmarks/bench_extension.py --output {out}{variant}" for role in RECIPES}
    commands.update({"none": commands[CONTROL], "yarn": commands[CONTROL]})
    rows, taken = collect(out, commands), []
    if args.baselines:
        rows, taken = with_baselines(out, rows, args.baselines, plan)
    table, goal = render_table(rows, plan), goal_lines(rows, plan)
    curves = {role: heldout_curve(out / RUN_DIRS[role]) for role in RECIPES}
    ruler = ruler_scores(out)
    asked = {"ppl": list(plan.ppl_lengths), "passkey": list(plan.passkey_lengths), "ruler": list(plan.passkey_lengths)}
    parts = goal_parts(rows, plan.original_context, curves, ruler, plan.trials * len(plan.depths), lengths=asked)
    atomic_write_text(out / "goal.json", json.dumps([asdict(p) for p in parts], indent=1) + "\n")
    curve_lines = [
        f"- {p['role']}, step {p['step']} ({p['tokens']:,} tokens): {curve_text(p)}"
        for p in sorted(points, key=lambda p: (p["role"], p["step"], "ppl" not in p))
    ]
    files = plot(out, rows, points, plan) if rows else []
    text = "\n".join(
        [
            f"# Does fine-tuning extend? YaRN ×{plan.factor:g} on SmolLM2-135M-Instruct",
            "",
            *table,
            "",
            "Goal:",
            *goal,
            "",
            "Gain against training tokens:",
            *curve_lines,
            "",
            "Held-out curves during training (eval.every; fine-tune at its target, control at L):",
            *(f"- {role}: " + ", ".join(f"{p.step}: {p.ppl:.3f}" for p in c) for role, c in curves.items() if c),
            "",
            "RULER (the battery's tasks, % of expected strings found):",
            *ruler_lines(ruler),
            "",
            "Goal of issue 41 (benchmarks/extension_goal.py):",
            *(p.line() for p in parts),
            verdict(parts),
            "",
            *(f"![]({Path(f).name})" for f in files),
        ]
    )
    atomic_write_text(out / "report.md", text + "\n")
    print(text)
    if args.evidence:
        machine, runtime = measured_on(out, args.machine)
        note = (
            "the extension experiment (benchmarks/bench_extension.py, docs/finetuning.md): SmolLM2-135M-Instruct "
            f"(L = 8,192) on {machine}; "
            "PPL: non-overlapping windows of held-out Emma with BOS; passkey: depths 0/0.25/0.5/0.75/1 x 6 trials "
            + (f"(each trial's depth drawn from depth +- {args.jitter:g}) " if args.jitter else "")
            + "per length (passkey_trials = prompts decoded; fewer than 30 = cell in progress); control = the same "
            "fine-tune without scaling"
            + (f"; {' and '.join(taken)}: the rows of {Path(args.baselines).name}" if taken else "")
            + (f"; {args.note}" if args.note else "")
        )
        for line in write_shipped(args.evidence, evidence_dict(rows, plan, note, runtime)):  # earlier cells stay
            print(f"evidence: {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
