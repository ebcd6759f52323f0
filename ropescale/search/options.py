"""Everything that defines a search, once: each field's default, its help and its command-line flag
(``ropescale search`` builds its parser from these fields, :func:`ropescale.options.add_arguments`).

No torch here: the command line imports this module to build its parser.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import options
from ..attention.modes import SEARCHED_MODES
from ..options import option
from .artifacts import DEFAULT_BASELINES

OBJECTIVES = ("perplexity", "needle", "mixed")
LAYOUTS = ("contiguous", "spread")
FLOORS = {"auto": None, "on": True, "off": False}


def depths(text: str | tuple[float, ...]) -> tuple[float, ...]:
    """``--needle-depths``: comma-separated numbers in [0, 1]."""
    if isinstance(text, tuple):
        return text
    try:
        return tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"--needle-depths must be comma-separated numbers in [0, 1], got {text!r}") from None


def lengths(text: str | tuple[int, ...]) -> tuple[int, ...]:
    """``--report-lengths``: comma-separated lengths (16384 or 16k, see :func:`ropescale.options.length`)."""
    if isinstance(text, tuple):
        return text
    if not text.strip():
        return ()
    return tuple(options.lengths(text, "--report-lengths"))


@dataclass
class SearchOptions:
    """Everything that defines a search (``ropescale search --help`` prints each field's help).

    ``method`` is ``longrope`` (per-pair factors), ``yarn`` (beta_fast, beta_slow, attention factor) or
    an attention-level method's grid (:mod:`.grid`); ``objective`` is what a candidate is scored by
    (:mod:`.needles`). ``model``, ``dtype``, ``device`` and ``attn_implementation`` take the shared
    ``--model`` and runtime flags; ``heldout`` (also score everything with the calibration protocol on
    the held-out text) has no flag.
    """

    target_length: int = option(
        type=options.length, metavar="N", help="context to extend to (factor = N / trained context)"
    )
    model: str = "smollm2-135m"
    method: str = option(
        "longrope",
        choices=["longrope", "yarn", *SEARCHED_MODES],
        help=f"what to search (default: longrope); {', '.join(SEARCHED_MODES)} search their parameters on a grid",
    )
    objective: str = option(
        "perplexity",
        choices=list(OBJECTIVES),
        help="score of a candidate: perplexity of the calibration windows (default), needle = NLL of the answer "
        "tokens of needle prompts at the target length (haystack: the calibration text), mixed = "
        "exp((1-w)·text NLL + w·answer NLL)",
    )
    needles: int | None = option(
        None,
        type=int,
        metavar="N",
        help="needle prompts per candidate, one forward pass each (default: as many as --needle-depths, else --windows)",
    )
    needle_depths: tuple[float, ...] = option(
        (),
        cli_default="",
        parse=depths,
        metavar="D,D,...",
        help="needle depths in [0, 1], cycled over the prompts (default: spread evenly over them)",
    )
    needle_seed: int = option(0, type=int, help="seed of the needle keys, the same for every candidate (default 0)")
    needle_weight: float = option(
        0.5, type=float, metavar="W", help="mixed: the needle's weight w in exp((1-w)·text NLL + w·answer NLL)"
    )
    budget: int = option(20, type=int, metavar="EVALS", help="candidates evaluated in all, seeds included (default 20)")
    eval_length: int | None = option(
        None, type=options.length, metavar="L", help="tokens per calibration window (default: the target length)"
    )
    windows: int = option(1, type=int, help="calibration windows per candidate (default 1)")
    layout: str = option(
        "contiguous",
        choices=list(LAYOUTS),
        help="contiguous positions, or the window cut into --chunks pieces spread over positions up to the "
        "target (a cheap proxy for the target length)",
    )
    chunks: int = option(4, type=int, help="pieces of a spread window (default 4)")
    seed: int = option(0, type=int, help="seed of the search")
    dtype: str = "auto"
    device: str = "auto"
    attn_implementation: str = "auto"
    max_ratio: float = option(1.25, type=float, help="longrope: factors at most this × s (default 1.25)")
    floor: bool | None = option(
        None,
        cli_default="auto",
        choices=list(FLOORS),
        parse=FLOORS.__getitem__,
        help="longrope: factors >= s on pairs whose wavelength exceeds the trained context (auto: on unless "
        "the calibration windows reach the target length)",
    )
    attention: str | float = option(
        "search",
        flag="--attention-factor",
        metavar="search|seed|yarn|X",
        help="longrope: search the attention factor (default), keep each seed's own, or fix it for every "
        "candidate to YaRN's 0.1 ln s + 1 or a number (advised with short calibration windows, which "
        "under-rate the attention temperature a long window needs)",
    )
    short: str = option(
        "long",
        choices=["long", "original"],
        help="longrope's short factors (used up to the trained context): 'long' = the searched schedule at every "
        "length (default, nothing switches at L), 'original' = plain RoPE up to L",
    )
    baselines: tuple[str, ...] = option(
        DEFAULT_BASELINES,
        cli_default=None,
        help="methods reported beside the result (default: linear,ntk,dynamic_ntk,yarn, and an attention-level "
        "--method itself at its defaults)",
    )
    report_lengths: tuple[int, ...] = option(
        (), cli_default="", parse=lengths, help="held-out contiguous windows, e.g. 16384,32768 (one window each)"
    )
    heldout: bool = True
    data: str | None = option(
        None, help="calibration text: corpus (austen, kjv), file, folder, JSONL/Parquet (default: austen)"
    )
    data_doc: str | None = option(
        None, metavar="TITLE", help="calibration document by title (default: the second longest)"
    )
    heldout_data: str | None = option(None, help="held-out text source (default: --data)")
    heldout_doc: str | None = option(None, metavar="TITLE", help="held-out document by title (default: the longest)")


def baselines_for(text: str | None, method: str) -> tuple[str, ...]:
    """``--baselines``, or the default for ``method`` (an attention-level method beside itself at its
    defaults, except STRING, whose defaults need frequencies beyond L)."""
    if text is not None:
        return tuple(b.strip() for b in text.split(",") if b.strip())
    own = (method,) if method in SEARCHED_MODES and method != "string" else ()
    return (*own, *DEFAULT_BASELINES)


__all__ = ["LAYOUTS", "OBJECTIVES", "SearchOptions", "baselines_for", "depths", "lengths"]
