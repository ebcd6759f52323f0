"""What ``ropescale recommend --budget fine-tune`` reads of a shipped extension experiment.

The experiments themselves (the four models, their suites, table, goal and evidence) are drivers in
benchmarks/ (``extension_plan.py``, ``bench_extension.py``, ``cpu_finetune_x2.py``); what they ship is an
evidence file in ``evals/measured/`` (:func:`ropescale.evals.advice.evidence.shipped_dict`), and this module
quotes it: the fine-tune's numbers beside its control's and training-free YaRN's, a caveat where it
retrieves less, and the recipe overrides of a variant that does not. The library never imports the
drivers.
"""

from __future__ import annotations

import itertools
import shlex
from dataclasses import dataclass

from ropescale.evals.advice.evidence import CONTROL, FINE_TUNED, Evidence, Measured, length_text, same_model
from ropescale.evals.tasks.proportions import difference_interval


@dataclass(frozen=True)
class FineTuneQuote:
    """What ``recommend --budget fine-tune`` says of a shipped extension experiment (:func:`fine_tune_measured`)."""

    line: str  #: the fine-tune's numbers beside its control's and training-free YaRN's
    caveat: str | None = None  #: where it retrieves less than the unscaled model or training-free YaRN
    #: recipe overrides of another shipped experiment (same model, factor and prompts) that retrieves
    #: at least as well as both wherever it measured, when the quoted one does not; and its numbers
    variant: tuple[str, ...] = ()
    variant_text: str | None = None
    source: Evidence | None = None  #: the quoted experiment
    variant_source: Evidence | None = None  #: the variant's experiment
    #: the variant trains recall sentences: its passkey cells measure a trained skill in its training format
    variant_trained: bool = False


def command_overrides(command: str) -> tuple[str, ...]:
    """The recipe overrides of a ``bench_extension.py`` command (``--overrides`` up to the next option);
    of a ``cpu_finetune_x2.py`` command, its ``--steps N``, which both its runs train as ``train.max_steps=N``."""
    try:
        words = shlex.split(command)
    except ValueError:  # unbalanced quotes (a hand-written command): nothing to name
        return ()
    if any(w.endswith("cpu_finetune_x2.py") for w in words):
        for i, word in enumerate(words):
            if word == "--steps":
                steps = words[i + 1] if i + 1 < len(words) else ""
            else:
                steps = word.removeprefix("--steps=") if word.startswith("--steps=") else ""
            if steps.isdigit():
                return (f"train.max_steps={steps}",)
        return ()
    for i, word in enumerate(words):
        if word == "--overrides":
            return tuple(itertools.takewhile(lambda w: not w.startswith("--"), words[i + 1 :]))
        if word.startswith("--overrides="):  # argparse gives the attached form its one value only
            return (word.removeprefix("--overrides="),)
    return ()


def fine_tuned_row(ev: Evidence) -> Measured | None:
    """The experiment's fine-tuned row (label ``FINE_TUNED``), None where it has none."""
    return next((r for r in ev.rows if r.label == FINE_TUNED), None)


def overrides_ran(ev: Evidence) -> tuple[str, ...]:
    """What its fine-tune's command changed in the recipe (``command_overrides`` of its first command)."""
    ft = fine_tuned_row(ev)
    return command_overrides(ft.commands[0]) if ft is not None and ft.commands else ()


def steps_trained(ev: Evidence, recipe_steps: int = 0) -> int:
    """The steps its fine-tune trained: its ``train.max_steps`` override, else ``recipe_steps``."""
    given = dict(o.split("=", 1) for o in overrides_ran(ev) if "=" in o)
    return int(given.get("train.max_steps", recipe_steps))


def fine_tune_measured(
    evidence: list[Evidence], model: str, factor: float, recipe_steps: int = 0
) -> FineTuneQuote | None:
    """The extension experiment of this model at this factor, if shipped: one line quoting fine-tuned YaRN
    against its control and training-free YaRN, and a caveat where it retrieves less than either. Of several
    experiments one whose ``status`` does not qualify its numbers comes first (a converged run before one
    that was not; of runs that did not converge, the longest trained), then the most complete (most passkey
    lengths, then prompts, then spread needles); where
    it has a caveat and another (same prompts) has none, that one's overrides are named as the variant (of
    several, the fewest training steps, an experiment without a ``train.max_steps`` override counted at
    ``recipe_steps``, then the lowest perplexity at the target length, factor × the trained context)."""

    def fine_tuned(ev: Evidence) -> Measured | None:
        ft = fine_tuned_row(ev)
        ok = ev.budget == "fine-tune" and same_model(ev.model, model) and ft is not None and ft.at_factor(factor)
        return ft if ok else None

    def completeness(ev: Evidence) -> tuple[int, int, bool]:
        ft = fine_tuned(ev)
        return len(ft.passkey), sum(ft.passkey_trials.values()), ev.passkey_jitter > 0

    def as_shipped(ev: Evidence) -> bool:  # the recipe itself, at most trained longer
        return all(o.split("=", 1)[0] in ("train.max_steps", "train.save_every") for o in overrides_ran(ev))

    matching = [ev for ev in evidence if fine_tuned(ev)]
    if not matching:
        return None
    # a run that stands as a result before one its experiment qualifies (a ``status``: a run that did not
    # converge), and of qualified ones the longest trained (the nearest to a result); of equally complete
    # ones, the recipe as it runs, then the smallest change to it (not file order)
    ev = max(
        matching,
        key=lambda other: (
            not other.status,
            completeness(other),
            as_shipped(other),
            steps_trained(other, recipe_steps) if other.status else 0,
            -len(overrides_ran(other)),
        ),
    )
    line, caveat, lost = _quote(ev)
    if not lost:  # nothing to remedy (a lower cell within its prompts' noise is not a loss)
        return FineTuneQuote(line, caveat, source=ev)

    def keeps_retrieval(other: Evidence) -> bool:  # same prompts, compared with both baselines, overrides to name
        same = other is not ev and other.passkey_jitter == ev.passkey_jitter and _quote(other)[1] is None
        return same and bool(_compared(other)) and bool(overrides_ran(other))

    def ppl_at_target(other: Evidence) -> float:  # not measured there: ranks last
        return fine_tuned(other).ppl.get(round(factor * (other.original_context or 0)), float("inf"))

    keeps = [other for other in matching if keeps_retrieval(other)]
    if not keeps:
        return FineTuneQuote(line, caveat, source=ev)
    # of equally complete ones, the cheapest to train (a longer GPU run of a variant keeps keys too, but
    # the cheaper one is what a user runs first), then the lower perplexity at the target
    best = max(
        keeps, key=lambda other: (completeness(other), -steps_trained(other, recipe_steps), -ppl_at_target(other))
    )
    ft, overrides = fine_tuned(best), overrides_ran(best)

    def cell(n: int) -> str:  # correct/decoded; fewer than 30 prompts: a cell still being measured
        k = ft.passkey_trials.get(n)
        count = f"{round(ft.passkey[n] * k)}/{k}" if k else f"{ft.passkey[n]:.2f}"
        return f"{length_text(n)} {count}" + (" so far" if k and k < 30 else "")

    ppl = "/".join(map(length_text, sorted(ft.ppl))) + " " + "/".join(f"{ft.ppl[n]:.2f}" for n in sorted(ft.ppl))
    quoted = overrides_ran(ev)
    instead = f" (not {shlex.join(quoted)})" if quoted else ""
    # recall sentences are the passkey's own task (a fact early in the window, asked for late): keys found
    # after training on them are a trained skill in the evaluation's format, not evidence of longer context
    trained = any(o.startswith("data.recall_facts=") and o.split("=", 1)[1].strip() not in ("0", "") for o in overrides)
    kept = "passkey in its training format (not evidence of extension)" if trained else "kept passkey retrieval"
    text = (
        f"the recipe as shipped with {shlex.join(overrides)}{instead}: {kept} at "
        f"{', '.join(map(length_text, _compared(best)))} on the same prompts ({best.source}): passkey "
        + ", ".join(map(cell, sorted(ft.passkey)))
        + (f"; PPL {ppl}" if ft.ppl else "")
        + (
            " — its recall sentences train the skill the passkey measures; perplexity past the trained context "
            "measures the extension"
            if trained
            else ""
        )
    )
    return FineTuneQuote(line, caveat, overrides, text, source=ev, variant_source=best, variant_trained=trained)


def _compared(ev: Evidence) -> list[int]:
    """The fine-tune's passkey lengths compared with a baseline of the same experiment: training-free
    YaRN's cells, and the unscaled model's at the fine-tune's shortest length; empty where either
    baseline has no cell to compare (nothing shows that it kept retrieval)."""
    rows = {r.label: r for r in ev.rows}
    ft, free, none = (rows.get(k) for k in (FINE_TUNED, "yarn", "none"))
    if not ft.passkey or none is None or min(ft.passkey) not in none.passkey:
        return []
    with_free = [n for n in sorted(ft.passkey) if free is not None and n in free.passkey]
    return sorted({min(ft.passkey), *with_free}) if with_free else []


def _quote(ev: Evidence) -> tuple[str, str | None, bool]:
    """One experiment's line, caveat, and whether it loses keys beyond its prompts' noise (:func:`fine_tune_measured`)."""
    rows = {r.label: r for r in ev.rows}
    ft, control, free, none = (rows.get(k) for k in (FINE_TUNED, CONTROL, "yarn", "none"))
    parts = []
    for n in sorted(ft.ppl):
        ref = f" (control {control.ppl[n]:.2f})" if control and n in control.ppl else ""
        parts.append(f"PPL {length_text(n)} {ft.ppl[n]:.2f}{ref}")
    for n in sorted(ft.passkey):
        base = f", training-free {free.passkey[n]:.2f}" if free and n in free.passkey else ""
        parts.append(f"passkey {length_text(n)} {ft.passkey[n]:.2f} on {ft.passkey_trials.get(n, '?')} prompts{base}")
    shown, noise = [], []  # where retrieval is below the unscaled model's (its shortest length) or training-free YaRN's

    def below(n: int, ref, whose: str) -> None:
        if ref is None or n not in ref.passkey or ft.passkey[n] >= ref.passkey[n]:
            return
        text = f"{length_text(n)} ({ft.passkey[n]:.2f} against {whose} {ref.passkey[n]:.2f})"
        a, b = ft.passkey_trials.get(n), ref.passkey_trials.get(n)
        clear = not (a and b) or difference_interval(ref.passkey[n] * b, b, ft.passkey[n] * a, a)[0] > 0
        (shown if clear else noise).append(text)

    if ft.passkey:
        below(min(ft.passkey), none, "the unscaled model's")
    for n in sorted(ft.passkey):
        below(n, free, "training-free YaRN's")
    caveat = None
    if shown or noise:
        said = [f"retrieves less at {', '.join(shown)}"] * bool(shown)
        said += [f"lower but within the noise of its prompts at {', '.join(noise)}"] * bool(noise)
        caveat = (
            f"the measured fine-tune {'; '.join(said)} ({ev.source})"
            + (": it lowers perplexity without restoring retrieval there" if shown else "")
            + "; check with `ropescale eval passkey` before relying on it"
        )
    factor = f"{ft.factor:g}" if ft.factor else "?"
    return f"fine-tune of this model at ×{factor} ({ev.source}): " + "; ".join(parts), caveat, bool(shown)
