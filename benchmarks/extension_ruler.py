"""RULER's tasks in the extension experiment: the battery's tasks (evals/tasks/ruler/) on the unscaled model,
the fine-tuned YaRN model and its control, each in its own folder of cells (``OUTPUT/ruler/<role>/``).

Recall sentences in the training windows train retrieval in their own forms; RULER's tasks (needles
among needles, variable tracking, common and frequent words) are formats the fine-tune never saw, so
they tell a trained skill from a trained format. The fine-tuned model runs at every length from L to
its target; the unscaled model and the control at L, where the goal compares them
(:mod:`.extension_goal`). Cells resume as ``ropescale eval ruler``'s do (``ruler_run.RulerRun``, the earlier layout).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ropescale.evals.advice.evidence import CONTROL, FINE_TUNED

#: the battery's offline tasks, as ``ropescale eval ruler`` runs them by default (docs/battery.md)
BATTERY = ("niah_single_1", "niah_multikey_2", "niah_multikey_3", "vt", "cwe", "fwe")
#: each role's folder under ``OUTPUT/ruler/`` (the control and the unscaled model share a label: ``none``)
FOLDERS = {"none": "none", FINE_TUNED: "yarn", CONTROL: "control"}
#: the suite a role's model belongs to (only the asked-for suites' models run)
SUITES = {"none": "base", FINE_TUNED: "finetuned", CONTROL: "control"}


def ruler_runs(
    out: str | Path,
    plan: Any,
    exports: dict[str, Path],
    suites: set[str],
    tasks: list[str],
    samples: int,
    runtime: Any = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Each role's ``ruler_run.RulerRun`` (not yet run): the unscaled base model (``none``) and
    the control (its export, unscaled) at L; the fine-tune (its export, its YaRN as saved) at L and
    every passkey length beyond it. Raises ValueError for an unknown task name."""
    from ruler_run import RulerRun

    from ropescale.evals.tasks.ruler.tasks import get_task
    from ropescale.scaling import Scaling

    chosen = [get_task(t) for t in tasks]
    L = plan.original_context
    long = [n for n in plan.passkey_lengths if n >= L]
    specs = {
        "none": (plan.model, Scaling("none"), [L]),
        FINE_TUNED: (str(exports[FINE_TUNED]), Scaling(None), long),
        CONTROL: (str(exports[CONTROL]), Scaling("none"), [L]),
    }
    essay = _emma(plan.data) if any(t.haystack == "essay" for t in chosen) else None
    return {
        role: RulerRun(
            model,
            scaling,
            chosen,
            lengths,
            samples,
            Path(out) / "ruler" / FOLDERS[role],
            plan.seed,
            runtime,
            essay,
            progress,
        )
        for role, (model, scaling, lengths) in specs.items()
        if SUITES[role] in suites
    }


def _emma(data: str) -> str:
    """The held-out novel, the haystack of the ``[austen]`` variants (as ``ropescale eval ruler``'s default)."""
    from ropescale.data.documents import load_documents

    docs = load_documents(data)
    return next((text for title, text in docs if title.lower() == "emma"), docs[0][1])


def ruler_scores(out: str | Path) -> dict[str, dict[str, dict[int, float]]]:
    """``{role: {task: {length: score 0-1}}}`` of the complete cells under ``OUTPUT/ruler/``."""
    from ropescale.evals.tasks.ruler.record import load_cells

    scores: dict[str, dict[str, dict[int, float]]] = {}
    for role, folder in FOLDERS.items():
        for record in load_cells(Path(out) / "ruler" / folder):
            if record.complete and record.prompt == "plain":  # the experiment's own cells: lm-eval's plain text
                scores.setdefault(role, {}).setdefault(record.task, {})[record.length] = record.score
    return scores


def ruler_lines(scores: dict[str, dict[str, dict[int, float]]]) -> list[str]:
    """The RULER table: one row per role and task, scores in % per length."""
    lengths = sorted({n for tasks in scores.values() for s in tasks.values() for n in s})
    if not lengths:
        return []
    head = "| model | task | " + " | ".join(f"{n // 1024}k" if n >= 1024 else str(n) for n in lengths) + " |"
    lines = [head, "|---" * (2 + len(lengths)) + "|"]
    for role in FOLDERS:
        for task, by in sorted(scores.get(role, {}).items()):
            cells = [f"{100 * by[n]:.1f}" if n in by else "" for n in lengths]
            lines.append(f"| {role} | {task} | " + " | ".join(cells) + " |")
    return lines


__all__ = ["BATTERY", "FOLDERS", "ruler_lines", "ruler_runs", "ruler_scores"]
