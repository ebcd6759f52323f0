"""The frontier: which methods keep BOTH the native model's perplexity and its retrieval at a factor.

A measured method (a :class:`~.evidence.Measured` row at factor s = N / L, N the target length, L
the trained context) is read against the unscaled model's row of the same evidence:

* **perplexity kept**: measured at the longest length in (L, N] the source measured, and at every
  measured length in (L, N] its perplexity is at most
  ``1 + tolerance`` times the native perplexity at L (the longest native length ≤ L), and at every
  measured length ≤ L at most ``1 + tolerance`` times the native perplexity at that same length
  (no short-context regression). Default tolerance: 1%.
* **retrieval kept**: measured at the source's longest passkey length ≤ N, and at every measured
  passkey length ≤ N the method is not shown below the native accuracy there: the native model's at
  that same length when it is ≤ L and measured (no short-context regression), else its accuracy at
  L (the longest native passkey length ≤ L). Not shown below = the 95% Wilson interval of the
  method's accuracy reaches the native one. With few trials the interval is wide, so the report
  prints trials and intervals beside every verdict; "kept" means "not shown lost", never "shown equal".
  The report also reads each part against the bar with point estimates (:func:`.frontier_bar.bar_parts`).

The Pareto view puts each method at (worst perplexity ratio, long or short, worst passkey accuracy
over the lengths ≤ N); a method is on the front when no other is at least as good on both and
better on one. :func:`frontier_choice` is what ``ropescale recommend`` reads: the method that keeps
both with the lowest worst perplexity ratio.
"""

from __future__ import annotations

import os
from pathlib import Path

from ropescale.evals.advice.evidence import Evidence, Measured
from ropescale.evals.advice.evidence import length_text as _k
from ropescale.evals.advice.frontier_bar import bar_table, with_rows  # noqa: F401 (with_rows: part of this API)
from ropescale.evals.advice.frontier_verdict import FEW_PROMPTS, FrontierVerdict, Reference  # noqa: F401 (FEW_PROMPTS: part of this API)
from ropescale.evals.advice.records import FrontierSuite, Params, SuiteEntry
from ropescale.evals.tasks.proportions import wilson_interval
from ropescale.markdown import table

#: perplexity allowed over native (fraction) for "perplexity kept"
PPL_TOLERANCE = 0.01


def reference(ev: Evidence, original_context: int) -> Reference | None:
    """Native perplexity and passkey at the longest measured lengths ≤ L (None: no native perplexity ≤ L)."""
    native = ev.find("default")
    if native is None:
        return None
    inside = [n for n in native.ppl if n <= original_context]
    if not inside:
        return None
    pk = [n for n in native.passkey if n <= original_context]
    n_pk = max(pk) if pk else None
    within = {n: native.passkey[n] for n in pk}
    return Reference(max(inside), native.ppl[max(inside)], n_pk, native.passkey[n_pk] if n_pk else None, within)


def _interval(row: Measured, n: int) -> tuple[float, float] | None:
    trials = row.passkey_trials.get(n)
    return wilson_interval(row.passkey[n] * trials, trials) if trials else None


def verdicts(
    ev: Evidence, original_context: int, target_length: int, tolerance: float = PPL_TOLERANCE
) -> tuple[Reference | None, list[FrontierVerdict]]:
    """Every scaled row of ``ev`` at factor N / L (rows without a factor: methods that need none,
    e.g. STRING within its reach) read against the native row.

    Args:
        ev: one source of measurements (a suite's results or a shipped file).
        original_context: the trained context L.
        target_length: N; lengths above it are ignored.
        tolerance: perplexity allowed over native, as a fraction.

    Returns:
        The native reference (None if the evidence has no native perplexity ≤ L) and the verdicts,
        Pareto front marked.
    """
    ref = reference(ev, original_context)
    if ref is None:
        return None, []
    native = ev.find("default")
    s = target_length / original_context
    # a verdict needs the row measured at the longest length this source measured (≤ N) for any method
    top_ppl = max((n for r in ev.rows for n in r.ppl if original_context < n <= target_length), default=None)
    top_pk = max((n for r in ev.rows for n in r.passkey if n <= target_length), default=None)
    out = []
    for row in ev.rows:
        if row.method == "default" or (row.factor is not None and not row.at_factor(s)):
            continue
        long = [row.ppl[n] / ref.ppl for n in row.ppl if original_context < n <= target_length]
        short = [row.ppl[n] / native.ppl[n] for n in row.ppl if n <= original_context and n in native.ppl]
        cells = tuple(
            (n, row.passkey[n], row.passkey_trials.get(n), _interval(row, n))
            for n in sorted(row.passkey)
            if n <= target_length
        )
        short_ok = all(r <= 1 + tolerance for r in short)
        keeps_ppl = False if not short_ok else (max(long) <= 1 + tolerance if top_ppl in row.ppl else None)
        keeps_retrieval = None
        if top_pk in row.passkey and ref.passkey is not None:
            keeps_retrieval = all((ci[1] if ci else acc) >= ref.passkey_bar(n) for n, acc, _, ci in cells)
        out.append(
            FrontierVerdict(
                row,
                max(long) if long else None,
                max(short) if short else None,
                min(acc for _, acc, _, _ in cells) if cells else None,
                cells,
                keeps_ppl,
                keeps_retrieval,
            )
        )
    return ref, _mark_pareto(out)


def _mark_pareto(items: list[FrontierVerdict]) -> list[FrontierVerdict]:
    """The training-free front among the rows measured at the source's longest lengths (a row
    missing those cells would be compared on easier ones); fine-tuned rows shown beside it are
    neither on it nor move it."""
    placed = [
        v
        for v in items
        if v.worst_ratio is not None
        and v.passkey_min is not None
        and v.keeps_ppl is not None
        and v.keeps_retrieval is not None
        and v.row.budget != "fine-tune"
    ]

    def dominated(v: FrontierVerdict) -> bool:
        return any(
            o.worst_ratio <= v.worst_ratio
            and o.passkey_min >= v.passkey_min
            and (o.worst_ratio < v.worst_ratio or o.passkey_min > v.passkey_min)
            for o in placed
        )

    front = {id(v) for v in placed if not dominated(v)}
    return [FrontierVerdict(**{**v.__dict__, "pareto": id(v) in front}) for v in items]


def frontier_choice(
    evidence: list[Evidence], original_context: int, target_length: int
) -> tuple[FrontierVerdict, Evidence, Reference] | None:
    """The first source (in ``evidence`` order) with a method at N / L that keeps both, and that
    method: a :attr:`~FrontierVerdict.confirmed` one before one whose retrieval rests on a few prompts, then
    the highest :attr:`~FrontierVerdict.passkey_floor` (all of them keep perplexity within the tolerance;
    retrieval is what training-free methods lose), then the lowest worst perplexity ratio; None if
    no source has one."""
    for ev in evidence:
        ref, found = verdicts(ev, original_context, target_length)
        both = [v for v in found if v.keeps_both and v.row.budget != "fine-tune"]
        if both:
            best = min(both, key=lambda v: (not v.confirmed, -v.passkey_floor, v.worst_ratio))
            return best, ev, ref
    return None


def _yes(flag: bool | None) -> str:
    return "n/m" if flag is None else ("yes" if flag else "no")


def format_frontier(ev: Evidence, original_context: int, target_length: int, tolerance: float = PPL_TOLERANCE) -> str:
    """A markdown report: the reference, one row per method with both verdicts, and the rule."""
    ref, found = verdicts(ev, original_context, target_length, tolerance)
    if ref is None:
        return f"no native (unscaled) perplexity at or below {original_context:,} in {ev.source}: nothing to compare"
    lengths = sorted({n for v in found for n, *_ in v.passkey_cells})
    pk_ref = f"passkey {ref.passkey:.2f} at {_k(ref.passkey_length)}" if ref.passkey is not None else "no passkey"
    lines = [
        f"# Frontier at ×{target_length / original_context:g} ({_k(target_length)}): {ev.model}",
        "",
        f"Source: {ev.source} ({ev.note}). Native reference: PPL {ref.ppl:.2f} at {_k(ref.ppl_length)}, {pk_ref}.",
        "",
    ]
    rows = []
    for v in sorted(found, key=lambda v: (not v.keeps_both, v.ppl_ratio or float("inf"))):
        cells = {n: (acc, trials, ci) for n, acc, trials, ci in v.passkey_cells}
        shown = []
        for n in lengths:
            if n not in cells:
                shown.append("n/m")
                continue
            acc, trials, ci = cells[n]
            shown.append(f"{acc:.2f}" + (f" · {trials} [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""))
        ratio = f"{v.ppl_ratio:.3f}" if v.ppl_ratio is not None else "n/m"
        short = f"{v.short_ratio:.3f}" if v.short_ratio is not None else "n/m"
        name = f"**{v.row.title}**" if v.keeps_both else v.row.title
        rows.append([name, ratio, short, *shown, _yes(v.keeps_ppl), _yes(v.keeps_retrieval), "●" if v.pareto else ""])
    heads = ["method", "worst PPL / native", "short PPL / native", *(f"passkey {_k(n)}" for n in lengths)]
    lines.append(table([*heads, "keeps PPL", "keeps retrieval", "Pareto"], rows))
    both = [v.row.title for v in found if v.keeps_both]
    lines += ["", *bar_table(found, ref, tolerance, original_context)]
    lines += [
        "",
        f"Keeps both: {', '.join(both) if both else 'none'}.",
        "",
        f"Rules: PPL kept = every measured length in ({_k(original_context)}, {_k(target_length)}] within "
        f"{tolerance:.0%} of native at {_k(ref.ppl_length)}, and every length ≤ {_k(original_context)} within "
        f"{tolerance:.0%} of native at that length. Retrieval kept = at every passkey length ≤ "
        f"{_k(target_length)} the 95% Wilson interval (cells: accuracy · prompts [interval]) reaches the native "
        f"accuracy (at the same length up to {_k(original_context)}, at {_k(original_context)} beyond): not shown "
        "lost, which few prompts cannot tell from equal. n/m: not measured. Pareto: among the rows measured at "
        "the longest lengths.",
    ]
    if any(v.row.budget == "fine-tune" for v in found):
        lines += [
            "",
            "Fine-tuned rows are shown, never chosen: their perplexity ratios are against the unscaled model, so "
            "they include what fine-tuning learnt of the training text; read them against their control in "
            "their source file.",
        ]
    return "\n".join(lines)


def format_verdict(ev: Evidence, original_context: int, target_length: int) -> str:
    """The answer in a line per method that keeps both (or the one that came closest), for the terminal."""
    ref, found = verdicts(ev, original_context, target_length)
    head = f"frontier at ×{target_length / original_context:g} ({_k(target_length)}), {ev.model}:"
    if ref is None:
        return f"{head} no native (unscaled) perplexity at or below {original_context:,}: nothing to compare"

    def facts(v: FrontierVerdict) -> str:
        ratio = f"worst PPL {v.ppl_ratio:.3f}× native" if v.ppl_ratio is not None else "PPL n/m"
        trials = sorted({t for _, _, t, _ in v.passkey_cells if t})
        prompts = f", {'-'.join(map(str, sorted({trials[0], trials[-1]})))} prompts per length" if trials else ""
        passkey = f"passkey ≥ {v.passkey_min:.2f}{prompts}" if v.passkey_min is not None else "passkey n/m"
        return f"{v.row.title} ({ratio}; {passkey})"

    both = [v for v in found if v.keeps_both]
    if both:
        best = min(both, key=lambda v: (not v.confirmed, -v.passkey_floor, v.worst_ratio))
        lines = [f"{head} keeps perplexity and retrieval: " + ", ".join(v.row.title for v in both)]
        return "\n".join([*lines, f"best:   {facts(best)}"])
    closest = min(found, key=lambda v: v.worst_ratio or float("inf"), default=None)
    return f"{head} no method keeps both" + (f"; closest in perplexity: {facts(closest)}" if closest else "")


def plot_frontier(ev: Evidence, original_context: int, target_length: int, path: str | os.PathLike) -> Path | None:
    """Worst passkey accuracy (with its interval) against worst perplexity ratio, front and goal marked.

    Returns:
        The PNG written, or None when no method has both numbers.
    """
    from ropescale.plots import figure, save_png
    from ropescale.plots.labels import place_labels

    ref, found = verdicts(ev, original_context, target_length)
    placed = [v for v in found if v.worst_ratio is not None and v.passkey_min is not None]
    if ref is None or not placed:
        return None
    fig = figure(figsize=(7, 4.8), dpi=120)
    ax = fig.add_subplot()
    if ref.passkey is not None:
        ax.axhspan(ref.passkey, 1.05, xmin=0, xmax=1, color="tab:green", alpha=0.06)
        label = f"native passkey at {_k(ref.passkey_length)} ({ref.passkey:.2f})"
        higher = {n: a for n, a in ref.passkey_within.items() if a > ref.passkey}
        if higher:  # the bar is higher at a shorter length: say so where the line cannot show it
            label += "; bar at " + ", ".join(f"{_k(n)}: {a:.2f}" for n, a in sorted(higher.items()))
        ax.axhline(ref.passkey, color="tab:green", lw=0.8, ls="--", label=label)
    ax.axvline(1 + PPL_TOLERANCE, color="tab:red", lw=0.8, ls="--", label=f"native PPL +{PPL_TOLERANCE:.0%}")
    points, labels, avoid = [], [], []
    for v in sorted(placed, key=lambda v: v.worst_ratio):
        worst = min(v.passkey_cells, key=lambda c: c[1])
        ci = worst[3]
        yerr = [[v.passkey_min - ci[0]], [ci[1] - v.passkey_min]] if ci else None
        color = "tab:green" if v.keeps_both else ("tab:blue" if v.pareto else "tab:gray")
        tuned = v.row.budget == "fine-tune"
        partial = v.keeps_ppl is None or v.keeps_retrieval is None  # not measured at the longest lengths
        bars = ax.errorbar(
            v.worst_ratio,
            v.passkey_min,
            yerr=yerr,
            fmt="s" if tuned else "o",
            color=color,
            mfc="white" if partial else color,
            capsize=3,
            alpha=0.9,
        )
        avoid += [*bars.lines[1], *bars.lines[2]]  # caps and bars: no label covers another's interval
        points.append((v.worst_ratio, v.passkey_min))
        labels.append(
            v.row.title
            + (" (fine-tuned)" if tuned and "fine-tuned" not in v.row.title else "")
            + (" (cells missing)" if partial else "")
        )
    front = sorted((v for v in placed if v.pareto), key=lambda v: v.worst_ratio)
    if len(front) > 1:
        ax.step(
            [v.worst_ratio for v in front],
            [v.passkey_min for v in front],
            where="post",
            color="tab:blue",
            lw=1,
            label="Pareto front",
        )
    ratios = [v.worst_ratio for v in placed]
    wide = max(ratios) / min(ratios) > 2  # a collapsed method far right: log, else the 1% matters
    if wide:
        from matplotlib.ticker import FuncFormatter, NullFormatter

        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:.3g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.margins(x=0.2)
    ax.set_ylim(-0.05, 1.08)
    ax.set_xlabel(
        f"worst perplexity / native (beyond L: native at {_k(ref.ppl_length)}; within: same length)"
        + (" (log)" if wide else "")
    )
    ax.set_ylabel(f"worst passkey accuracy up to {_k(target_length)}")
    ax.set_title(
        f"{ev.model}: perplexity vs retrieval at ×{target_length / original_context:g} (green: keeps both; "
        "hollow: not measured at the longest lengths)",
        fontsize=9,
    )
    ax.grid(True, which="both", alpha=0.3)
    place_labels(ax, points, labels, avoid=avoid)  # where they cover no other label, point or interval
    ax.legend(loc="best", fontsize=8)  # "best" is measured against the labels too
    return save_png(fig, path, bbox_inches="tight")


#: the candidates ``ropescale eval frontier`` runs by default, by label
CANDIDATES = ("yarn", "ntk", "dynamic_ntk", "self_extend", "dca", "string-yarn")
#: candidates run only when named (``--methods``), by label: (method, parameters). The
#: attention-level methods with ``logn=true`` (ours), and the reference variants the defaults are
#: not (docs/methods.md): DCA as ChunkLlama's flash-decoding file, Self-Extend as LongLM's Llama.py,
#: and DCA / STRING as ropescale ran them before taking the reference defaults
OPTIONAL_PARAMS: dict[str, tuple[str, Params]] = {
    "self_extend-logn": ("self_extend", {"logn": True}),
    "dca-logn": ("dca", {"logn": True}),
    "dca-flash": ("dca", {"variant": "chunkllama_flash"}),
    "self_extend-float": ("self_extend", {"shift": "float"}),
    "dca-l16-notemp": ("dca", {"variant": "chunkllama_flash", "temperature": False}),
    "string-yarn-own-factor": ("string", {"frequencies": "yarn", "temperature": "frequencies"}),
}
OPTIONAL = tuple(OPTIONAL_PARAMS)


def frontier_suite(
    model: str,
    original_context: int,
    target_length: int,
    candidates: list[str] | None = None,
    depths: list[float] | None = None,
    trials: int = 1,
    data: str = "austen",
    max_tokens: int = 4096,
    jitter: float = 0.0,
    saved: bool = False,
) -> FrontierSuite:
    """The suite ``ropescale eval frontier`` runs: the candidates at N / L, perplexity and passkey at
    L/4, L and each doubling up to N (native passkey only up to L, where it is the reference).

    Args:
        candidates: labels among :data:`CANDIDATES` (default: all of those): YaRN, NTK, dynamic NTK,
            Self-Extend, DCA and STRING with YaRN's frequencies, each at N / L (DCA and STRING with
            their reference defaults); or :data:`OPTIONAL` (the log-length query scale, the other
            reference variants).
        depths, trials: passkey grid per length (default depths 0.2/0.4/0.6/0.8, 1 trial).
        max_tokens: tokens scored per perplexity length (non-overlapping windows; at least one window).
        jitter: each passkey trial's depth drawn from depth +- jitter (0: the fixed depths;
            ``evals/tasks/passkey.py``).
        saved: also the checkpoint as saved (a scaled checkpoint: its own scaling is a candidate, the
            ``none`` row removes it; ``evals/tasks/saved.py``).

    Raises:
        ValueError: an unknown candidate.
    """
    s = target_length / original_context
    entries: dict[str, SuiteEntry] = {
        name: {"method": name, "factor": s} for name in ("yarn", "ntk", "dynamic_ntk", "self_extend", "dca")
    }
    entries["string-yarn"] = {
        "method": "string",
        "factor": s,
        "params": {"frequencies": "yarn"},
        "label": "string-yarn",
    }
    for label, (method, params) in OPTIONAL_PARAMS.items():
        entries[label] = {"method": method, "factor": s, "params": dict(params), "label": label}
    unknown = [c for c in candidates or [] if c not in entries]
    if unknown:
        raise ValueError(f"unknown frontier candidate '{unknown[0]}'; known: {', '.join(CANDIDATES + OPTIONAL)}")
    lengths = [original_context // 4, original_context]
    while lengths[-1] < target_length:
        lengths.append(min(2 * lengths[-1], target_length))
    pk_lengths = [original_context // 2, *lengths[1:]]
    native: SuiteEntry = {"method": "none", "only": {"passkey": [n for n in pk_lengths if n <= original_context]}}
    return {
        "name": f"frontier-{Path(model).name}-{_k(target_length)}",
        "model": model,
        "data": data,
        "seed": 0,
        "methods": [native, *([{"method": "saved"}] if saved else []), *(entries[c] for c in candidates or CANDIDATES)],
        "perplexity": {"lengths": lengths, "mode": "nonoverlap", "max_tokens": max_tokens},
        "passkey": {
            "lengths": pk_lengths,
            "depths": depths or [0.2, 0.4, 0.6, 0.8],
            "trials": trials,
            "jitter": jitter,  # always: absent means the spread default (a cell's key leaves out 0, as before)
        },
    }
