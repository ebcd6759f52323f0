"""The held-out curves of CPU fine-tunes, drawn the way their convergence is judged (issue 54).

Left: each run's held-out Emma perplexity against training steps (the fine-tune at its target length,
the control at the trained length), as ``metrics.jsonl`` records it every ``eval.every`` steps. Right:
the same curves as the rule of ``ropescale.training.convergence.curve_falling`` reads them: between each
point and the one before it, the mean change of the held-out windows' NLL with its 95 % t interval (the
windows are the same at every point, so their differences are paired), as a rate per 40 steps, and the
tolerance, a fall of 0.25 % of perplexity per 40 steps (dashed). A curve whose last bar reaches below
the dashed line is "not converged": its windows do not exclude a fall faster than the tolerance.

    python benchmarks/heldout_plot.py evals/measured/finetune-cpu-x2 evals/measured/finetune-cpu-x2-640steps \\
        --output docs/img/cpu-finetune-x2-heldout.png

Each folder is a shipped fine-tune (``benchmarks/cpu_finetune_x2.py --ship``) or a run folder: every
``*metrics.jsonl`` in it is one curve, named by the folder and the file. Reads the logs only.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ropescale.training.convergence import (
    FALL_TOLERANCE,
    TOLERANCE_STEPS,
    fall_tolerance,
    heldout_records,
    paired_change,
)


def step_changes(records: Sequence[Mapping[str, Any]]) -> list[tuple[int, float, float]]:
    """``(step, mean ΔNLL, half-width of its 95 % t interval)`` from each held-out point to the next, over
    the windows both scored, each as a rate per ``TOLERANCE_STEPS`` steps (a change over 80 steps is
    halved), so that one tolerance line serves curves evaluated every 40 or every 80 steps; a pair of
    points without the same two or more windows is left out (no spread to show)."""
    out = []
    for before, last in zip(records, records[1:]):
        change = paired_change(before, last)
        if change is not None:
            per = TOLERANCE_STEPS / (int(last["step"]) - int(before["step"]))
            out.append((int(last["step"]), change[0] * per, change[1] * per))
    return out


def curves_of(folders: Sequence[Path]) -> dict[str, list[dict[str, Any]]]:
    """``"<folder> <run>" -> held-out records`` for every ``*metrics.jsonl`` in ``folders`` (a run folder's
    own ``metrics.jsonl`` is named by its parent and itself); logs without a held-out point are left out."""
    out: dict[str, list[dict[str, Any]]] = {}
    for given in folders:
        folder = Path(given).resolve()
        for log in sorted(folder.glob("*metrics.jsonl")):
            records = heldout_records(log)
            run = log.name.removesuffix("metrics.jsonl").rstrip("-")
            name = f"{folder.name} {run}" if run else f"{folder.parent.name} {folder.name}"
            if records:
                out[name] = records
    return out


def plot(curves: Mapping[str, Sequence[Mapping[str, Any]]], path: Path, title: str) -> Path:
    """Both panels for ``curves`` (name -> held-out records), written atomically at ``path``."""
    from ropescale.plots import figure, length_label, save_png

    fig = figure(figsize=(11, 4.2))
    left, right = fig.subplots(1, 2)
    for i, (name, records) in enumerate(curves.items()):
        color = f"C{i}"
        length = records[0].get("eval_length")
        label = f"{name} at {length_label(int(length))}" if length else name
        left.plot([r["step"] for r in records], [r["eval_ppl"] for r in records], marker="o", color=color, label=label)
        changes = step_changes(records)
        if changes:
            offset = (i - (len(curves) - 1) / 2) * 3  # side by side where two runs share a step
            right.errorbar(
                [s + offset for s, _, _ in changes],
                [m for _, m, _ in changes],
                yerr=[e for _, _, e in changes],
                fmt="o",
                capsize=3,
                color=color,
                label=label,
            )
    left.set_yscale("log")
    from matplotlib.ticker import FormatStrFormatter

    for axis in (left.yaxis.set_major_formatter, left.yaxis.set_minor_formatter):  # 25.5, not 2.55 x 10^1
        axis(FormatStrFormatter("%g"))
    left.set_xlabel("training step")
    left.set_ylabel("held-out Emma perplexity (log)")
    left.set_title("held-out curve")
    left.legend(fontsize=8)
    right.axhline(0, color="grey", lw=1)
    tolerance = f"tolerance: {100 * FALL_TOLERANCE:g} % per {TOLERANCE_STEPS} steps"
    right.axhline(-fall_tolerance(TOLERANCE_STEPS), color="grey", lw=1, ls="--", label=tolerance)
    floor = -8 * fall_tolerance(TOLERANCE_STEPS)  # the early steps' falls would squash the ones judged
    if right.get_ylim()[0] < floor:
        right.set_ylim(bottom=floor)
        right.annotate("larger early falls run below the axis", (0.02, 0.02), xycoords="axes fraction", fontsize=8)
    right.set_xlabel("training step (change from the point before)")
    right.set_ylabel(f"mean Δ window NLL per {TOLERANCE_STEPS} steps, 95 % t (paired)")
    right.set_title("converged: the last bar stays above the dashed line")
    right.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return save_png(fig, path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("--output", type=Path, required=True, help="the PNG to write")
    ap.add_argument("--title", default="SmolLM2-135M-Instruct, CPU fine-tune (YaRN) and its control")
    args = ap.parse_args(argv)
    curves = curves_of(args.folders)
    if not curves:
        print(f"heldout_plot: no held-out point in any *metrics.jsonl of {', '.join(map(str, args.folders))}")
        return 2
    for name, records in curves.items():
        last = step_changes(records)[-1:]
        said = (
            f"; last change {last[0][1]:+.4f} ± {last[0][2]:.4f} per {TOLERANCE_STEPS} steps (95 % t)" if last else ""
        )
        print(f"{name}: {len(records)} points, steps {records[0]['step']}-{records[-1]['step']}{said}")
    print(plot(curves, args.output, args.title))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
