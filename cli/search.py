"""``ropescale search``: calibrate LongRoPE factors (YaRN's parameters, or an attention-level method's) for a
model and target length, on perplexity or on needle retrieval."""

from __future__ import annotations

import argparse

from ..attention.modes import SEARCHED_MODES
from .common import add_model_args, add_runtime_args

EXAMPLES = """examples:
  ropescale search --target-length 32768 --output runs/search-32k                      # LongRoPE, eval at 32k
  ropescale search --target-length 32768 --eval-length 4096 --layout spread --budget 16 --output runs/s
  ropescale search --model ./llama --target-length 16384 --method yarn --data ./calib.txt --heldout-data ./held.txt
  ropescale search --target-length 16384 --method self_extend --objective needle --needles 3 --output runs/se
  ropescale patch --from-search runs/search-32k --output ./smollm2-32k               # use the result

Re-run the same command to resume; every evaluated candidate is in DIR/history.json.
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "search",
        help="search per-pair RoPE factors (LongRoPE), YaRN's or an attention-level method's parameters for a model "
        "and target length",
        description="Search, for this model and target length, the per-pair rescale factors of LongRoPE (or "
        "YaRN's beta_fast/beta_slow/attention factor, or Self-Extend's, DCA's or STRING's parameters on a grid) that "
        "minimise perplexity (or the answer-token NLL of needle prompts) on a calibration text, seeded "
        "with PI, NTK and YaRN (or the method's defaults); report on a different (held-out) text. Writes DIR/config.json (rope_parameters "
        "that plain transformers reads), DIR/best.json, DIR/history.json, DIR/report.md and DIR/factors.png.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_args(p)
    p.add_argument(
        "--target-length",
        type=int,
        required=True,
        metavar="N",
        help="context to extend to (factor = N / trained context)",
    )
    p.add_argument(
        "--method",
        default="longrope",
        choices=["longrope", "yarn", *SEARCHED_MODES],
        help=f"what to search (default: longrope); {', '.join(SEARCHED_MODES)} search their parameters on a grid",
    )
    p.add_argument(
        "--objective",
        default="perplexity",
        choices=["perplexity", "needle", "mixed"],
        help="score of a candidate: perplexity of the calibration windows (default), needle = NLL of the answer "
        "tokens of needle prompts at the target length (haystack: the calibration text), mixed = "
        "exp((1-w)·text NLL + w·answer NLL)",
    )
    p.add_argument(
        "--needles",
        type=int,
        default=None,
        metavar="N",
        help="needle prompts per candidate, one forward pass each (default: as many as --needle-depths, else --windows)",
    )
    p.add_argument(
        "--needle-depths",
        default="",
        metavar="D,D,...",
        help="needle depths in [0, 1], cycled over the prompts (default: spread evenly over them)",
    )
    p.add_argument("--needle-seed", type=int, default=0, help="seed of the needle keys (default 0)")
    p.add_argument(
        "--needle-weight", type=float, default=0.5, metavar="W", help="mixed: the needle's weight w (default 0.5)"
    )
    p.add_argument(
        "--data",
        default=None,
        help="calibration text: corpus (austen, kjv), file, folder, JSONL/Parquet (default: austen)",
    )
    p.add_argument(
        "--data-doc", default=None, metavar="TITLE", help="calibration document by title (default: the second longest)"
    )
    p.add_argument("--heldout-data", default=None, help="held-out text source (default: --data)")
    p.add_argument(
        "--heldout-doc", default=None, metavar="TITLE", help="held-out document by title (default: the longest)"
    )
    p.add_argument(
        "--budget",
        type=int,
        default=20,
        metavar="EVALS",
        help="candidates evaluated in all, seeds included (default 20)",
    )
    p.add_argument(
        "--eval-length",
        type=int,
        default=None,
        metavar="L",
        help="tokens per calibration window (default: the target length)",
    )
    p.add_argument("--windows", type=int, default=1, help="calibration windows per candidate (default 1)")
    p.add_argument(
        "--layout",
        default="contiguous",
        choices=["contiguous", "spread"],
        help="contiguous positions, or the window cut into --chunks pieces spread over positions up to the "
        "target (a cheap proxy for the target length)",
    )
    p.add_argument(
        "--short",
        choices=("long", "original"),
        default="long",
        help="longrope's short factors (used up to the trained context): 'long' = the searched schedule at every "
        "length (default, nothing switches at L), 'original' = plain RoPE up to L",
    )
    p.add_argument("--chunks", type=int, default=4, help="pieces of a spread window (default 4)")
    p.add_argument("--max-ratio", type=float, default=1.25, help="longrope: factors at most this × s (default 1.25)")
    p.add_argument(
        "--floor",
        default="auto",
        choices=["auto", "on", "off"],
        help="longrope: factors >= s on pairs whose wavelength exceeds the trained context (auto: on unless "
        "the calibration windows reach the target length)",
    )
    p.add_argument(
        "--attention-factor",
        default="search",
        metavar="search|seed|yarn|X",
        help="longrope: search the attention factor (default), keep each seed's own, or fix it for every "
        "candidate to YaRN's 0.1 ln s + 1 or a number (advised with short calibration windows, which "
        "under-rate the attention temperature a long window needs)",
    )
    p.add_argument(
        "--baselines",
        default=None,
        help="methods reported beside the result (default: linear,ntk,dynamic_ntk,yarn, and an attention-level "
        "--method itself at its defaults)",
    )
    p.add_argument(
        "--report-lengths", default="", help="held-out contiguous windows, e.g. 16384,32768 (one window each)"
    )
    add_runtime_args(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--output", required=True, metavar="DIR", help="results folder (resumed when it holds the same search)"
    )
    p.add_argument("--overwrite", action="store_true", help="discard an earlier search in DIR")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run)


def _depths(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"--needle-depths must be comma-separated numbers in [0, 1], got {text!r}") from None


def _baselines(text: str | None, method: str) -> tuple[str, ...]:
    if text is not None:
        return tuple(b.strip() for b in text.split(",") if b.strip())
    own = (method,) if method in ("self_extend", "dca") else ()  # STRING's defaults need frequencies beyond L
    return (*own, "linear", "ntk", "dynamic_ntk", "yarn")


def _lengths(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"--report-lengths must be comma-separated integers, got {text!r}") from None
    return values


def run(args: argparse.Namespace) -> int:
    import time

    from ..search import SearchOptions, run_search_job

    options = SearchOptions(
        target_length=args.target_length,
        model=args.model,
        method=args.method,
        objective=args.objective,
        needles=args.needles,
        needle_depths=_depths(args.needle_depths),
        needle_seed=args.needle_seed,
        needle_weight=args.needle_weight,
        budget=args.budget,
        eval_length=args.eval_length,
        windows=args.windows,
        layout=args.layout,
        chunks=args.chunks,
        seed=args.seed,
        dtype=args.dtype,
        device=args.device,
        attn_implementation=args.attn_implementation,
        max_ratio=args.max_ratio,
        floor={"auto": None, "on": True, "off": False}[args.floor],
        attention=args.attention_factor,
        short=args.short,
        baselines=_baselines(args.baselines, args.method),
        report_lengths=_lengths(args.report_lengths),
        data=args.data,
        data_doc=args.data_doc,
        heldout_data=args.heldout_data,
        heldout_doc=args.heldout_doc,
    )
    start = time.time()
    report = run_search_job(options, args.output, overwrite=args.overwrite, progress=not args.no_progress)
    from ..search.artifacts import markdown_report

    print(markdown_report(report))
    plot = ", factors.png" if report["settings"]["method"] in ("longrope", "yarn") else ""
    print(
        f"wrote {args.output}/config.json (rope_parameters: {report['settings']['method']}), best.json, history.json, "
        f"report.md{plot} in {time.time() - start:.0f} s"
    )
    return 0
