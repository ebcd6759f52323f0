"""Redraw the pictures in docs/img/ from the shipped numbers, without running a model.

    python benchmarks/redraw_docs_plots.py            # writes docs/img/demo.png and the frontier plots
    python benchmarks/redraw_docs_plots.py --output /tmp/img

Each picture goes through the product's own plotting code, with the numbers it was measured with:

* ``demo.png``: what ``make demo`` (``ropescale eval suite smollm2-demo``) draws as
  ``perplexity_vs_length.png``. No ``results.json`` of that suite is shipped, so its numbers are the
  README's table (bf16, one window per length, 2026-11-25), copied here; a cell the suite skips (n/r)
  is absent, as in the suite's own results.
* ``frontier-2x.png``, ``frontier-4x-30.png``, ``frontier-4x-30-spread.png``: what ``ropescale eval
  frontier`` draws, from the shipped evidence in ``evals/measured/`` (and the fine-tuned rows it
  shows with ``--also``), read as that command reads them.

``frontier-4x.png`` (the first 4x frontier, 4 prompts) is not redrawn: its suite's cells were not
shipped.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ropescale.evals.advice.evidence import load_measured
from ropescale.evals.advice.frontier import plot_frontier, with_rows
from ropescale.plots.curves import plot_perplexity_curves

ROOT = Path(__file__).resolve().parent.parent
MEASURED = ROOT / "evals" / "measured"

#: ``ropescale eval suite smollm2-demo`` (README.md, "The main job"): perplexity by method and length
DEMO = {
    "none": {2048: 32.62, 8192: 29.98, 16384: 56.18},
    "linear": {2048: 132.02, 8192: 146.47},
    "ntk": {16384: 32.05},
    "dynamic_ntk": {16384: 33.04},
    "yarn": {2048: 34.66, 8192: 32.30, 16384: 32.73},
}

#: picture: (shipped evidence, rows shown beside it as with ``--also``, target length N)
FRONTIERS = {
    "frontier-2x.png": ("smollm2-135m-frontier.json", None, 16384),
    "frontier-4x-30.png": ("smollm2-135m-frontier-30.json", "smollm2-135m-finetune.json", 32768),
    "frontier-4x-30-spread.png": (
        "smollm2-135m-frontier-30-jitter.json",
        "smollm2-135m-finetune-400steps-jitter.json",
        32768,
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "img", help="folder (default: docs/img)")
    args = parser.parse_args()
    print(
        plot_perplexity_curves(
            DEMO,
            [2048, 8192, 16384],
            args.output / "demo.png",
            model="smollm2-135m",
            factor=4,
            trained_context=8192,
        )
    )
    for name, (source, also, target) in FRONTIERS.items():
        ev = load_measured(MEASURED / source)
        if also:
            ev = with_rows(ev, load_measured(MEASURED / also))
        print(plot_frontier(ev, ev.original_context or 8192, target, args.output / name))


if __name__ == "__main__":
    main()
