"""What the shipped extension experiments say of a fine-tune, for ``ropescale recommend --budget fine-tune``.

A fine-tune extends the context when its perplexity past the trained context L stays where its control's
(the same fine-tune without scaling) does not: that is the reason the short answer gives, with the file
and its cells. Its passkey cells say what it does to retrieval, losses first. A recipe whose data writes
recall sentences ("Colonel Ashby's parcel number is 40817.", ``data.recall_facts``) trains the very skill
the passkey measures, so its keys are labelled a trained skill in the passkey's format, not evidence of
extension, and never given as the reason to pick it (issue 40).
"""

from __future__ import annotations

import shlex
from typing import Any

from ropescale.errors import RopescaleError
from ropescale.evals.advice.evidence import CONTROL, FINE_TUNED, Evidence, Measured, same_model
from ropescale.evals.advice.evidence import length_text as _k
from ropescale.evals.advice.finetune_evidence import (
    fine_tune_measured,
    fine_tuned_row,
    overrides_ran,
    steps_trained,
)
from ropescale.evals.tasks.proportions import difference_interval


def fine_tune_evidence(rec: Any, evidence: list[Evidence], recipe: str | None, keys: str) -> None:
    """What the shipped extension experiments say of the fine-tune: for this model, its perplexity against
    its control's (the measure of extension) as the reason, its retrieval losses, and a recipe that keeps
    the keys, said to be a skill trained in the passkey's format where its data has recall sentences;
    for another model, the retrieval of the measured one as an illustration."""
    found = fine_tune_measured(evidence, rec.model, rec.ratio, recipe_steps(recipe))
    if found is None:
        other = next((ev.model for ev in evidence if ev.budget == "fine-tune"), None)
        shown = fine_tune_measured(evidence, other, rec.ratio, recipe_steps(recipe)) if other else None
        if shown is not None:
            rec.retrieval = f"on {other} (the shape, not the numbers): {_fine_tune_passkey(shown.source)}"
            rec.reasons.append(f"measured on {other}, another model: {shown.line}; {shown.caveat or ''}")
        return
    rec.measured = found.line
    rec.why = _extension_line(found.source, rec.original_context, recipe_steps(recipe))
    longer = _steps_override(found.source, recipe_steps(recipe))
    if longer and recipe:  # the command trains what was measured, not the recipe's shorter default
        rec.commands = [
            (what, f"{cmd} {longer}" if what == "fine-tune (PoSE)" and cmd.startswith("ropescale train") else cmd)
            for what, cmd in rec.commands
        ]
    if found.source.status:  # the experiment's own word on its numbers (a run that did not converge), first
        rec.caveats.insert(0, f"the measured run: {found.source.status}")
    rec.reasons.insert(0, rec.why)  # the evidence first, then the rule it bears out
    rec.reasons.append("measured " + rec.measured)
    trained = _trains_recall(found.source, recipe)
    label = f"{TRAINED_FORMAT}: " if trained and fine_tuned_row(found.source).passkey else ""
    rec.retrieval = label + _fine_tune_passkey(found.source)
    rec.reasons.append("retrieval: " + rec.retrieval)
    if found.variant and recipe:
        rec.also.append(_variant_line(found))
        rec.reasons.append("also shipped: " + found.variant_text)
        what = "fine-tune with recall sentences (passkey: a trained skill)" if found.variant_trained else None
        rec.commands.insert(
            1,
            (
                what or "fine-tune keeping passkey retrieval",
                f"ropescale train --config {recipe} {keys} {shlex.join(found.variant)}",
            ),
        )
    on_cpu = cpu_experiment(evidence, rec.model, rec.ratio, found.source)
    cpu_recipe = _cpu_recipe(recipe)
    if on_cpu is not None and cpu_recipe:  # the run a machine without a GPU can repeat, quoted beside
        rec.also.append(_cpu_line(on_cpu, cpu_recipe, rec.original_context))
        rec.reasons.append("also shipped: " + rec.also[-1])
        steps = _steps_override(on_cpu, recipe_steps(cpu_recipe)) or ""
        rec.commands.insert(  # after the recipe's own fine-tune and its variant
            2 if found.variant and recipe else 1,
            ("fine-tune on a CPU", " ".join(w for w in ("ropescale train --config", cpu_recipe, keys, steps) if w)),
        )


#: the script of issue 54's CPU experiments (benchmarks/cpu_finetune_x2.py): its evidence names it in each row's command
CPU_DRIVER = "cpu_finetune_x2.py"


def _on_cpu(ev: Evidence) -> bool:
    ft = fine_tuned_row(ev)
    return ft is not None and bool(ft.commands) and CPU_DRIVER in ft.commands[0]


def cpu_experiment(evidence: list[Evidence], model: str, factor: float, quoted: Evidence | None) -> Evidence | None:
    """The CPU experiment of this model at this factor (issue 54's protocol: the ``_cpu`` recipe on two
    cores, held-out Emma alone, RULER's countable tasks), where the quoted experiment is another kind: a
    user without a GPU reads what the recipe they can run did. Of several, one whose ``status`` does not
    qualify its numbers, then the longest trained; None where the quoted experiment is one itself."""
    if quoted is not None and _on_cpu(quoted):
        return None
    mine = [
        ev
        for ev in evidence
        if ev.budget == "fine-tune" and same_model(ev.model, model) and _on_cpu(ev)
        if fine_tuned_row(ev).at_factor(factor)
    ]

    return max(mine, key=lambda ev: (not ev.status, steps_trained(ev)), default=None)


def _cpu_recipe(recipe: str | None) -> str | None:
    """The CPU-sized variant of ``recipe`` (``smollm2-135m/yarn_x4`` -> ``smollm2-135m/yarn_x4_cpu``) where
    one is shipped: the recipe issue 54's experiments train (benchmarks/cpu_finetune_x2.py ``RECIPES``)."""
    if not recipe:
        return None
    name = recipe if recipe.endswith("_cpu") else f"{recipe}_cpu"
    try:
        from ropescale.training.config import resolve_recipe

        resolve_recipe(name)
    except (ImportError, OSError, RopescaleError):
        return None
    return name


def _cpu_line(ev: Evidence, recipe: str, original_context: int) -> str:
    """The CPU experiment in one line: its perplexity past L against its control's at L, its retrieval
    result as the experiment states it, and its own word on its numbers (``status``)."""
    rows = {r.label: r for r in ev.rows}
    ft, control = rows[FINE_TUNED], rows.get(CONTROL)
    lengths = [n for n in sorted(ft.ppl) if n >= original_context]
    ppl = "/".join(map(_k, lengths)) + " " + "/".join(f"{ft.ppl[n]:.2f}" for n in lengths)
    against = ""
    if control and original_context in control.ppl and lengths:
        ratio = ft.ppl[lengths[-1]] / control.ppl[original_context]
        against = (
            f" against its control's {control.ppl[original_context]:.2f} at {_k(original_context)} "
            f"({ratio:.3f}× at {_k(lengths[-1])})"
        )
    ran = overrides_ran(ev)
    how = f" with {shlex.join(ran)}" if ran else ""
    said = [f"on a CPU ({recipe}{how}, {ev.source}): fine-tuned YaRN ×{ft.factor:g} PPL {ppl}{against}"]
    said += [ev.retrieval] * bool(ev.retrieval)
    said += [ev.status] * bool(ev.status)
    return "; ".join(said)


#: how a fine-tune's passkey cells are labelled when its data trains recall sentences (issue 40)
TRAINED_FORMAT = "trained format (not evidence of extension)"


def _cell(row: Measured, n: int) -> str:
    k = row.passkey_trials.get(n)
    return f"{round(row.passkey[n] * k)}/{k}" if k else f"{row.passkey[n]:.2f}"


def _fine_tune_passkey(ev: Evidence) -> str:
    """A fine-tune's passkey in one sentence: lost where it finds fewer keys than the unscaled model (at
    its shortest length) or training-free YaRN beyond the noise of their prompts; elsewhere no fewer than
    they (which at 4× L may still be few: the numbers are beside each length)."""
    rows = {r.label: r for r in ev.rows}
    ft, free, none = rows[FINE_TUNED], rows.get("yarn"), rows.get("none")
    if not ft.passkey:  # an experiment judged on RULER's tasks instead (issue 54's CPU fine-tune)
        if ev.retrieval:  # its result, as the experiment states it
            return f"{ev.retrieval} ({ev.source})"
        return f"no passkey cells ({ev.source}: retrieval measured on RULER's tasks, in its report)"
    lost, noise, kept = [], [], []
    for n in sorted(ft.passkey):
        refs = [(none, "unscaled")] * (n == min(ft.passkey)) + [(free, "training-free YaRN")]
        refs = [(r, who) for r, who in refs if r is not None and n in r.passkey]
        below = [(r, who) for r, who in refs if r.passkey[n] > ft.passkey[n]]
        shown = "; ".join(f"{who} {_cell(r, n)}" for r, who in (below or refs))
        text = f"{_k(n)} {_cell(ft, n)}" + (f" ({shown})" if shown else "")
        a = ft.passkey_trials.get(n)

        def clear(r: Measured) -> bool:
            b = r.passkey_trials.get(n)
            return not (a and b) or difference_interval(r.passkey[n] * b, b, ft.passkey[n] * a, a)[0] > 0

        (lost if any(clear(r) for r, _ in below) else noise if below else kept).append(text)
    said = [f"lost at {', '.join(lost)}"] * bool(lost)
    said += [f"lower within its prompts' noise at {', '.join(noise)}"] * bool(noise)
    said += [f"no fewer than they at {', '.join(kept)}"] * bool(kept)
    return f"passkey {'; '.join(said)} ({ev.source})"


def _variant_line(found: Any) -> str:
    """The shipped variant in a few words: what it changes, its keys (in the passkey's own format when its
    data has recall sentences) and its perplexity, the measure of extension."""
    ev = found.variant_source
    ft = fine_tuned_row(ev)
    keys = ", ".join(f"{_k(n)} {_cell(ft, n)}" for n in sorted(ft.passkey))
    ppl = "/".join(map(_k, sorted(ft.ppl))) + " " + "/".join(f"{ft.ppl[n]:.2f}" for n in sorted(ft.ppl))
    what = (
        f"with recall sentences (second command): passkey {keys}: {TRAINED_FORMAT}, its sentences train the "
        "skill the passkey measures"
        if found.variant_trained
        else f"with {shlex.join(found.variant)} (second command): passkey {keys}"
    )
    return f"{what}; PPL {ppl} ({ev.source})"


def _extension_line(ev: Evidence, original_context: int, recipe_steps: int = 0) -> str:
    """The fine-tune's perplexity at and past the trained context against its control's: what says it
    extends the context (the control, trained the same without scaling, is the model's own past L)."""
    rows = {r.label: r for r in ev.rows}
    ft, control = rows[FINE_TUNED], rows.get(CONTROL)
    lengths = [n for n in sorted(ft.ppl) if n >= original_context] or sorted(ft.ppl)
    ours = "/".join(f"{ft.ppl[n]:.2f}" for n in lengths)
    theirs = [n for n in lengths if control and n in control.ppl]
    against = (
        f" against its control's {'/'.join(f'{control.ppl[n]:.2f}' for n in theirs)}"
        + ("" if theirs == lengths else f" at {'/'.join(map(_k, theirs))}")
        if theirs
        else ""
    )
    ran = overrides_ran(ev)
    how = f", trained with {shlex.join(ran)}" if ran else ""
    if _steps_override(ev, recipe_steps):
        how += f", as the command below does; the recipe alone runs {recipe_steps}"
    return (
        f"measured on this model ({ev.source}{how}): fine-tuned YaRN ×{ft.factor:g} PPL "
        f"{'/'.join(map(_k, lengths))} {ours}{against} (the same fine-tune without scaling): perplexity past "
        f"the trained {_k(original_context)} is what measures the extension"
    )


def _steps_override(ev: Evidence, recipe_steps: int) -> str | None:
    """``train.max_steps=N`` where the quoted fine-tune trained N steps and the recipe runs other: the
    command recommend prints then carries it, so that it trains what was measured (the ×2 CPU recipe runs
    320 steps, which did not converge; the run quoted trained 640)."""
    ran = overrides_ran(ev)
    steps = next((o for o in ran if o.startswith("train.max_steps=")), None)
    return steps if steps and recipe_steps and steps != f"train.max_steps={recipe_steps}" else None


def _trains_recall(ev: Evidence, recipe: str | None) -> bool:
    """Whether the quoted fine-tune trained recall sentences (its recipe's ``data.recall_facts`` with the
    overrides it ran with): its passkey cells then measure a skill trained in the passkey's own format."""
    overrides = list(overrides_ran(ev))
    try:
        from ropescale.training.config import load_config

        return bool(recipe) and load_config(recipe, overrides).data.recall_facts > 0
    except (ImportError, OSError, RopescaleError):
        return any(o.startswith("data.recall_facts=") and o.split("=", 1)[1].strip() != "0" for o in overrides)


def recipe_steps(recipe: str | None) -> int:
    """The steps ``recipe`` trains (0 where it cannot be read: ``ropescale train`` absent, a placeholder)."""
    try:
        from ropescale.training.config import load_config

        return load_config(recipe).train.max_steps if recipe else 0
    except (ImportError, OSError, RopescaleError):
        return 0
