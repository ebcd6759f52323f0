"""Calibrated LongRoPE search on the embedded SmolLM2-135M (trained at 8192) for a 32k target,
with a held-out report beside PI, NTK, dynamic NTK and YaRN from the same run.

Calibration: the first ``--eval-length`` tokens of *Mansfield Park*; held-out: *Emma* (one window
per length — non-overlapping windows, BOS, fp32 — the
``--report-lengths`` cells follow). On a 2-core CPU a 32k window costs minutes, so the search
scores each candidate on a cheap proxy by default: ``--eval-length`` (3072) tokens cut into 3 chunks
spread over positions 0..32767 (``--layout spread``), which exercises every relative distance up
to the target, with the attention factor fixed at YaRN's 0.1 ln s + 1 for every candidate
(``--attention-factor yarn``: a 3k-token window has fewer keys per query than a 32k one and would
pull the temperature down). Everything is resumable: re-run the same command to continue, or with more
``--report-lengths``/``--baselines`` to add held-out cells (finished cells are never recomputed).

    python benchmarks/bench_search.py --output runs/bench-search --budget 12 --baselines yarn
    python benchmarks/bench_search.py --output runs/bench-search --budget 12 --baselines yarn --report-lengths 32768,16384
    python benchmarks/bench_search.py --output runs/bench-search --budget 12 --baselines none,linear,ntk,dynamic_ntk,yarn
    python benchmarks/bench_search.py --output runs/bench-search --budget 12 --baselines none,yarn --report-lengths 8192

Measured (2 cores, fp32, 12 candidates, 888 s of search): held-out Emma, one window each —
searched 31.82 / 31.99 / 32.81 at 8k / 16k / 32k, YaRN 32.22 / 32.68 / 33.11, unscaled 29.97 at 8k;
at 32k NTK 33.51, dynamic NTK 44.94, linear 157.90 (each 32k cell ~7-8 min).
On the spread proxy itself the unscaled model and NTK (attention factor 1) score better than both:
the proxy screens frequency schedules under a fixed temperature; it cannot rank methods.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--output", default="runs/bench-search")
    ap.add_argument("--target-length", type=int, default=32768)
    ap.add_argument("--method", default="longrope")
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--eval-length", type=int, default=3072)
    ap.add_argument("--layout", default="spread", choices=["spread", "contiguous"])
    ap.add_argument("--chunks", type=int, default=3)
    ap.add_argument("--windows", type=int, default=1)
    ap.add_argument("--attention-factor", default="yarn", help="search | seed | yarn (0.1 ln s + 1) | a number")
    ap.add_argument("--calibration-doc", default="Mansfield Park")
    ap.add_argument("--heldout-doc", default="Emma")
    ap.add_argument("--baselines", default="linear,ntk,dynamic_ntk,yarn")
    ap.add_argument("--report-lengths", default="", help="held-out contiguous lengths, e.g. 16384,32768")
    ap.add_argument(
        "--no-heldout-proxy", action="store_true", help="skip the held-out cells at the calibration protocol"
    )
    args = ap.parse_args()

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from ropescale.search import SearchOptions, run_search_job

    options = SearchOptions(
        target_length=args.target_length,
        model=args.model,
        method=args.method,
        budget=args.budget,
        eval_length=args.eval_length,
        windows=args.windows,
        layout=args.layout,
        chunks=args.chunks,
        attention=args.attention_factor,
        baselines=tuple(b for b in args.baselines.split(",") if b),
        report_lengths=tuple(int(n) for n in args.report_lengths.split(",") if n),
        heldout=not args.no_heldout_proxy,
        data="austen",
        data_doc=args.calibration_doc,
        heldout_doc=args.heldout_doc,
    )
    start = time.perf_counter()
    report = run_search_job(options, args.output, progress=sys.stderr.isatty() or True)
    wall = time.perf_counter() - start
    print(open(os.path.join(args.output, "report.md")).read())
    print(f"wall time of this invocation: {wall:.0f} s; load average now {os.getloadavg()}")
    print(
        json.dumps(
            {
                "best": report["best"]["origin"],
                "calibration_ppl": report["best"]["ppl"],
                "search_seconds": report["search_seconds"],
            }
        )
    )


if __name__ == "__main__":
    main()
