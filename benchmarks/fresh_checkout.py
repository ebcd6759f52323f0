"""What ``cpu_finetune_x2.py`` redoes in a checkout that holds only what was committed.

A sitting may end with a fresh checkout: ``runs/`` is gone, with the training checkpoints (1.6 GB a
step of the full fine-tune: never committed) and the exports. What was committed stays: the cells
(``--ship``), each run's training log (``<run>-metrics.jsonl``: the held-out curve) and the prompt
journals of RULER cells in progress (:mod:`journals`). From them:

- a role whose every cell is committed needs no model: it is not trained again (the ×2 control once its
  perplexity cells are in; :func:`roles_needed`);
- a role that needs its model again (a RULER cell not finished) is retrained from the same recipe and
  seed. Its held-out curve is committed whole already, so the retrain evaluates the held-out text at
  its last step only (``eval.every`` = ``train.max_steps``: evaluation leaves the weights as they are,
  tests/training/test_trainer.py) and its log is committed beside the first as
  ``<run>-metrics-retrain.jsonl``. :func:`retrain_lines` compares the two, step by step: a retrain whose
  losses and last held-out windows equal the first run's trained the same weights, so the committed
  cells and curve are the retrained model's, and a RULER journal it left resumes (a journal names the
  model's content: other weights set it aside, never mix with it).

A retrain also takes the first run's opt-in code paths, which its log records step by step:
:func:`training_env` sets the environment variable that decides over the recipe's key (the fused head
loss: ``ROPESCALE_FUSED_LOSS`` over ``train.head_loss``; a retrain on the other path trains other weights,
1e-3 apart in the loss by step 7). The logs of issue 54's runs predate the key: their steps took the
path by the variable alone.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

#: the suffix of a retrain's training log in the committed folder (the first run's: ``-metrics.jsonl``)
RETRAIN_LOG = "-metrics-retrain.jsonl"


def shipped_log(ship: Path, run: Path) -> Path:
    """The committed copy of ``run``'s training log (the first run's, never a retrain's)."""
    return ship / f"{run.name}-metrics.jsonl"


def curve_source(ship: Path, run: Path) -> Path:
    """Where ``run``'s held-out curve is read: its committed log where there is one (a retrain's own log
    has its last point only), else the run's folder."""
    log = shipped_log(ship, run)
    return log if log.is_file() else run


def retrain_overrides(recipe: str, given: list[str], run: Path, ship: Path) -> list[str]:
    """``["eval.every=<max_steps>"]`` for a retrain (see the module), else ``[]``.

    A retrain: the committed log holds the held-out curve to ``train.max_steps`` and ``run`` holds no
    training of its own yet, or holds a retrain that an earlier command began and a kill cut short (its
    ``config.yaml`` says ``eval.every`` = ``max_steps`` where the recipe says otherwise)."""
    from ropescale.training.config import load_config, load_run_config
    from ropescale.training.convergence import heldout_records

    config = load_config(recipe, given)
    steps, every = config.train.max_steps, config.eval.every
    if not every or every == steps:
        return []
    mine = [f"eval.every={steps}"]
    if (run / "config.yaml").is_file():
        return mine if load_run_config(run).eval.every == steps else []
    log = shipped_log(ship, run)
    curve = heldout_records(log) if log.is_file() else []
    return mine if curve and int(curve[-1]["step"]) >= steps else []


#: an opt-in training path a step's log line records -> (its value there, the variable that turns it on);
#: ropescale/training/trainer.py writes them, ropescale/scoring/nll.py reads the variable
STEP_PATHS = {"head_loss": ("fused", "ROPESCALE_FUSED_LOSS")}


def training_env(log: Path) -> dict[str, str]:
    """The environment that takes the code paths ``log``'s steps took (``log``: a training log or a run
    folder, as ``heldout_records`` reads them): ``{"ROPESCALE_FUSED_LOSS": "1"}``
    where every step says ``head_loss: fused``, ``"0"`` where none does, ``{}`` without a log (a first
    run takes the caller's environment). A log whose steps took both paths cannot be retrained to the
    same weights: SystemExit(2), naming the file.

    Logs written before the trainer recorded the path (2026-12-05, commit 5c41482: the 320-step ×2 pair's)
    say nothing of it, and read as "0" here; the report's step-by-step comparison is what tells."""
    log = log if log.is_file() or not log.is_dir() else log / "metrics.jsonl"
    steps = [r for r in _lines(log) if "loss" in r]
    env = {}
    for key, (value, variable) in STEP_PATHS.items():
        took = {r.get(key) == value for r in steps}
        if len(took) > 1:
            print(
                f"cpu_finetune_x2: {log}: some steps say {key}={value} and some do not; no one setting of "
                f"{variable} trains those weights again",
                file=sys.stderr,
            )
            raise SystemExit(2)
        if took:
            env[variable] = "1" if took.pop() else "0"
    return env


def env_prefix(env: dict[str, str]) -> str:
    """``env`` as a command line's prefix, the settings that differ from the defaults only
    (``ROPESCALE_FUSED_LOSS=1 ``; ``""`` where all are off)."""
    return "".join(f"{k}={v} " for k, v in sorted(env.items()) if v != "0")


def roles_needed(expected: dict[str, list[Path]]) -> dict[str, bool]:
    """``role -> whether its model is needed``: not where every cell it is measured in exists (committed,
    or measured earlier in this folder). ``expected``: each role's cell paths."""
    return {role: not all(p.is_file() for p in paths) for role, paths in expected.items()}


def plan_lines(
    recipes: dict[str, str],
    expected: dict[str, list[Path]],
    needed: dict[str, bool],
    extra: dict[str, list[str]],
    given: list[str],
    trained: dict[str, bool],
    envs: dict[str, dict[str, str]] | None = None,
) -> list[str]:
    """What a run would do for each role (``cpu_finetune_x2.py --dry-run``): not train it (every cell
    committed), measure a trained one, or train it (again, and how: ``envs``, :func:`training_env`), and the
    cells it would measure."""
    lines = []
    for role, recipe in recipes.items():
        missing = ", ".join(p.name for p in expected[role] if not p.is_file())
        if not needed[role]:
            lines.append(f"{role}: every cell committed; not trained")
        elif trained[role]:
            lines.append(f"{role}: trained; to measure: {missing}")
        else:
            how = f"to retrain with {extra[role][0]}" if extra[role] else "to train"
            if env := (envs or {}).get(role):
                how += " and " + ", ".join(f"{k}={v}" for k, v in sorted(env.items())) + " as its log's steps"
            lines.append(f"{role}: {how} ({recipe}, {' '.join(given) or 'as the recipe says'}); to measure: {missing}")
    return lines


def _lines(path: Path) -> list[dict[str, Any]]:
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines() if path.is_file() else []:
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a line cut short by a kill
        if isinstance(row, dict) and "step" in row:
            rows.append(row)
    return rows


def compare_logs(first: Path, retrain: Path) -> dict[str, Any] | None:
    """How a retrain's log compares with the first run's: the steps both logged, how many losses are
    equal, the largest loss difference, and whether the retrain's last held-out windows equal the first
    run's at that step. None without a retrain log."""
    if not retrain.is_file():
        return None
    loss = {int(r["step"]): float(r["loss"]) for r in _lines(first) if "loss" in r}
    mine = {int(r["step"]): float(r["loss"]) for r in _lines(retrain) if "loss" in r}
    common = sorted(set(loss) & set(mine))
    held = {int(r["step"]): r.get("eval_window_nll") for r in _lines(first) if "eval_ppl" in r}
    evals = [r for r in _lines(retrain) if "eval_ppl" in r]
    last = evals[-1] if evals else None
    return {
        "steps": len(common),
        "equal": sum(loss[s] == mine[s] for s in common),
        "max_diff": max((abs(loss[s] - mine[s]) for s in common), default=None),
        "last_step": max(mine, default=None),
        "heldout_step": int(last["step"]) if last else None,
        "heldout_equal": bool(last) and held.get(int(last["step"])) == last.get("eval_window_nll"),
        "heldout_ppl": float(last["eval_ppl"]) if last else None,
    }


def retrain_lines(ships: Path | dict[str, Path], runs: dict[str, Path]) -> list[str]:
    """The report's lines on each retrained role: the same weights as the committed curve's, or not
    (``ships``: the committed folder of every role's logs, or each role's own)."""
    out = []
    for role, run in runs.items():
        ship = ships[role] if isinstance(ships, dict) else ships
        got = compare_logs(shipped_log(ship, run), ship / f"{run.name}{RETRAIN_LOG}")
        if got is None:
            continue
        same = got["steps"] and got["equal"] == got["steps"] and got["heldout_equal"]
        held = (
            f"held-out at step {got['heldout_step']} {got['heldout_ppl']:.4f}, its windows "
            + ("equal to" if got["heldout_equal"] else "NOT equal to")
            + " the first run's"
            if got["heldout_step"] is not None
            else "no held-out point yet"
        )
        losses = (
            f"loss equal at {got['equal']} of {got['steps']} steps (largest difference {got['max_diff']:.3g})"
            if got["steps"]
            else "no step logged by both runs"
        )
        out.append(
            f"- {role}: retrained in a later sitting (checkpoints are not committed) to step {got['last_step']}; "
            f"{losses}; {held}: "
            + (
                "the same weights as the committed curve's"
                if same
                else "NOT the first run's weights: cells measured on the retrain are another model's"
            )
        )
    return out
