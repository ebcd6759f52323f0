"""Does fine-tuning extend? The four-model experiment: its suites, its table, its verdict, its evidence.

Four models on the same held-out text and the same passkey prompts (docs/finetuning.md):

==================  =========================================================================
``none``            the model as trained (its context L)
``yarn``            training-free YaRN ×s
``fine-tuned yarn`` YaRN ×s, then fine-tuned at that scaling (PoSE windows spread over s·L)
``control``         fine-tuned the same way (same text, windows, steps, optimizer) WITHOUT
                    scaling, positions kept within L: what it gains is adaptation to the text
==================  =========================================================================

What ``fine-tuned yarn`` gains over ``control`` is context extension; what both gain over ``none``
at short lengths is adaptation to the training text. Three suites measure them (one per model
folder: the base model runs ``none`` and ``yarn``; each export runs as saved), and
:func:`collect` reads their ``results.json`` back into one :class:`~.evidence.Measured` row per
model, which :func:`render_table`, :func:`goal_lines` and :func:`evidence_dict` turn into the
report, the goal's verdict and the shipped evidence (``evals/measured/``). The library
quotes that evidence for ``ropescale recommend --budget fine-tune`` (evals/advice/finetune_evidence.py); it never
imports this driver.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ropescale.errors import RopescaleError
from ropescale.evals.advice.evidence import (
    CONTROL,
    FINE_TUNED,
    Evidence,
    Measured,
    length_text,
    load_measured,
    load_results,
    same_model,
    shipped_dict,
)
from ropescale.evals.tasks.proportions import wilson_interval
from ropescale.markdown import table
from ropescale.models.runtime import runtime_text, same_runtime

ROLES = ("none", "yarn", FINE_TUNED, CONTROL)
#: the suite folder each role's cells live in, and its label inside that suite
SUITE_OF = {
    "none": ("base", "none"),
    "yarn": ("base", "yarn"),
    FINE_TUNED: ("finetuned", FINE_TUNED),
    CONTROL: ("control", CONTROL),
}
#: the training run's folder of each fine-tuned role (its export: ``<folder>-export``)
RUN_DIRS = {FINE_TUNED: "yarn", CONTROL: "control"}


@dataclass(frozen=True)
class Plan:
    """The experiment's protocol: what every model is measured on."""

    model: str = "smollm2-135m"
    factor: float = 4.0
    original_context: int = 8192
    ppl_lengths: tuple[int, ...] = (2048, 8192, 16384, 32768)
    passkey_lengths: tuple[int, ...] = (4096, 8192, 16384, 32768)
    depths: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    trials: int = 6
    #: passkey placement: 0 = fixed depths (every shipped cell); h = each trial's depth drawn from depth +- h
    jitter: float = 0.0
    ppl_max_tokens: int = 4096
    data: str = "austen"
    dtype: str = "auto"
    seed: int = 0
    #: passkey lengths of the unscaled models (none, control): they cannot retrieve beyond L
    short_only: tuple[str, ...] = field(default=("none", CONTROL))

    def short(self) -> list[int]:
        return [n for n in self.passkey_lengths if n <= self.original_context]

    @classmethod
    def at(cls, factor: float, **overrides) -> Plan:
        """The protocol at ×``factor``: perplexity at L/4, L and every doubling to factor·L, passkey at
        L/2, L and every doubling to factor·L (×4: the shipped lengths; ×8 adds 64k)."""
        L = overrides.get("original_context", cls.original_context)
        doublings = tuple(L * 2**k for k in range(1, int(factor).bit_length()) if L * 2**k <= factor * L)
        return cls(
            factor=float(factor),
            ppl_lengths=(L // 4, L, *doublings),
            passkey_lengths=(L // 2, L, *doublings),
            **overrides,
        )


#: the largest ``max_tokens`` whose ``budget: document`` cells score Emma alone: the perplexity task reads twice
#: the budget of the corpus, longest novel first, and Emma holds about 207k tokens
DOCUMENT_BUDGET_MAX = 65_536


def held_out_budget(max_tokens: int) -> str:
    """What a cell's ``max_tokens`` bounds: ``document`` (each document's first max_tokens), the protocol every
    cell committed before the key was measured with, where it scores Emma's tokens alone (``max_tokens`` up to
    65,536: the ×2 CPU protocol and every earlier one); ``cell`` beyond. There the corpus read runs past Emma
    into Mansfield Park, a book the fine-tune and its control train on: the ×4 CPU protocol's 131,072 tokens a
    cell took 55,608 of them, 30 % of every cell, as "held-out" text (issue 51 found the same in a shipped
    suite). ``cell`` scores the first max_tokens of Emma alone, the text the held-out curve is evaluated on."""
    return "document" if max_tokens <= DOCUMENT_BUDGET_MAX else "cell"


def suite_dicts(plan: Plan, finetuned: str | Path, control: str | Path) -> dict[str, dict[str, Any]]:
    """The three suites (``base``, ``finetuned``, ``control``) as :func:`~.suite.suite_from_dict` takes them.

    Args:
        finetuned: the exported fine-tuned model (it carries its YaRN scaling; re-applied as saved).
        control: the exported control model (unscaled).
    """
    common = {
        "dtype": plan.dtype,
        "data": plan.data,
        "seed": plan.seed,
        "perplexity": {
            "lengths": list(plan.ppl_lengths),
            "mode": "nonoverlap",
            "max_tokens": plan.ppl_max_tokens,
            "budget": held_out_budget(plan.ppl_max_tokens),
        },
        "passkey": {
            "lengths": list(plan.passkey_lengths),
            "depths": list(plan.depths),
            "trials": plan.trials,
            "jitter": plan.jitter,  # always: absent means the spread default (a cell's key leaves out 0, as before)
        },
    }
    short = {"passkey": plan.short()}
    yarn = {"method": "yarn", "factor": plan.factor}
    return {
        "base": {
            "name": "extension-base",
            "model": plan.model,
            "methods": [{"method": "none", "only": short}, {"label": "yarn", **yarn}],
            **common,
        },
        "finetuned": {
            "name": "extension-finetuned",
            "model": str(finetuned),
            "methods": [{"label": FINE_TUNED, **yarn}],
            **common,
        },
        "control": {
            "name": "extension-control",
            "model": str(control),
            "methods": [{"label": CONTROL, "method": "none", "only": short}],
            **common,
        },
    }


def collect(output: str | Path, commands: dict[str, str] | None = None) -> list[Measured]:
    """One row per role, read from ``output/<suite>/results.json`` (roles not yet measured are left out)."""
    output, rows = Path(output), []
    for role in ROLES:
        suite, label = SUITE_OF[role]
        evidence = load_results(output / suite / "results.json")
        found = [r for r in (evidence.rows if evidence else ()) if r.label == label]
        if found:
            command = (commands or {}).get(role)
            rows.append(replace(found[0], label=role, commands=(command,) if command else found[0].commands))
    return rows


def baseline_rows(path: str | Path, plan: Plan, runtime: dict[str, str] | None = None) -> list[Measured]:
    """The ``none`` and ``yarn`` rows of a shipped experiment (``evals/measured/...``), for a variant that
    trains and measures only its fine-tunes: the base model and training-free YaRN do not change with
    the recipe, so their cells are the other experiment's, on the same prompts and text. The file must be
    of this model, trained context and passkey placement, its ``yarn`` at this factor and, where
    ``runtime`` (the variant's cells' or, before any, its machine's) is given, of the same runtime.

    Raises:
        RopescaleError: one line naming the file and what differs (or that it has no such row).
    """
    ev = load_measured(path)  # unreadable or damaged: one line naming it
    checks = {
        "budget": (ev.budget, "fine-tune"),
        "original_context": (ev.original_context, plan.original_context),
        "passkey_jitter": (ev.passkey_jitter, plan.jitter),
    }
    if not same_model(ev.model, plan.model):
        checks["model"] = (ev.model, plan.model)
    for key, (theirs, ours) in checks.items():
        if theirs != ours:
            raise RopescaleError(f"{path}: {key} {theirs!r}, this experiment's {ours!r}")
    rows = [r for r in ev.rows if r.label in ("none", "yarn")]
    if not rows:
        raise RopescaleError(f"{path}: no 'none' or 'yarn' row")
    free = next((r for r in rows if r.label == "yarn"), None)
    if free is not None and not free.at_factor(plan.factor):
        raise RopescaleError(f"{path}: yarn at factor {free.factor!r}, this experiment's {plan.factor:g}")
    theirs = json.loads(Path(path).read_text()).get("runtime")  # the one key Evidence does not carry
    if runtime and not (theirs and same_runtime(theirs, runtime)):
        found = runtime_text(theirs) if theirs else "no recorded runtime"
        raise RopescaleError(f"{path}: runtime {found}, this experiment's {runtime_text(runtime)}")
    return rows


def _passkey_cell(row: Measured, n: int) -> str:
    if n not in row.passkey:
        return ""
    k = row.passkey_trials.get(n)
    if not k:
        return f"{row.passkey[n]:.2f}"
    hits = round(row.passkey[n] * k)
    lo, hi = wilson_interval(hits, k)
    return f"{row.passkey[n]:.2f} ({hits}/{k}, [{lo:.2f}, {hi:.2f}])"


def render_table(rows: list[Measured], plan: Plan) -> list[str]:
    """The four-model table: perplexity per window length, passkey per prompt length (Wilson 95%)."""
    ppl = [f"PPL {length_text(n)}" for n in plan.ppl_lengths]
    pk = [f"passkey {length_text(n)}" for n in plan.passkey_lengths]
    cells = [
        [r.label, *(f"{r.ppl[n]:.2f}" if n in r.ppl else "" for n in plan.ppl_lengths)]
        + [_passkey_cell(r, n) for n in plan.passkey_lengths]
        for r in rows
    ]
    return table(["model", *ppl, *pk], cells).splitlines()


def goal_lines(rows: list[Measured], plan: Plan, slack: float = 1.01) -> list[str]:
    """The goal, part by part: met, not met, or not measured yet (the numbers beside each)."""
    by = {r.label: r for r in rows}
    ft, control, none = by.get(FINE_TUNED), by.get(CONTROL), by.get("none")
    L, lines = plan.original_context, []

    def say(part: str, ok: bool | str | None, detail: str) -> None:
        status = ok if isinstance(ok, str) else "not measured yet" if ok is None else "met" if ok else "NOT met"
        lines.append(f"- {part}: {status} ({detail})")

    long = [n for n in plan.ppl_lengths if n > L]
    if not long:
        say("long-context perplexity", None, f"no perplexity length beyond {length_text(L)} asked")
    elif ft and control and L in control.ppl and all(n in ft.ppl for n in long):
        bar = slack * control.ppl[L]
        worst = max(ft.ppl[n] for n in long)
        say(
            f"PPL at {', '.join(map(length_text, long))} ≤ {slack:g} × control's PPL({length_text(L)}) = {bar:.2f}",
            worst <= bar,
            f"worst {worst:.2f}",
        )
        rising = [ft.ppl[n] for n in sorted({L, *long}) if n in ft.ppl]
        say(
            f"PPL not rising from {length_text(L)} to the target",
            all(b <= a * 1.002 for a, b in zip(rising, rising[1:])),
            " → ".join(f"{x:.2f}" for x in rising),
        )
    else:
        say("long-context perplexity", None, "fine-tuned or control cells missing")
    short = min(plan.ppl_lengths)
    if ft and control and short in ft.ppl and short in control.ppl:
        say(
            f"PPL({length_text(short)}) ≤ {slack:g} × control's",
            ft.ppl[short] <= slack * control.ppl[short],
            f"{ft.ppl[short]:.2f} vs {control.ppl[short]:.2f}",
        )
    first = min(plan.passkey_lengths)
    if ft and none and first in ft.passkey and first in none.passkey:
        say(
            f"passkey at {length_text(first)} ≥ the unscaled model's",
            ft.passkey[first] >= none.passkey[first],
            f"{ft.passkey[first]:.2f} vs {none.passkey[first]:.2f}",
        )
    else:
        say(f"passkey at {length_text(first)}", None, "cells missing")
    bar = none.passkey.get(L) if none else None
    for n in [n for n in plan.passkey_lengths if n >= L]:
        if ft is None or n not in ft.passkey or bar is None:
            say(f"passkey at {length_text(n)} ≥ the unscaled model's at {length_text(L)}", None, "cells missing")
            continue
        k, full = ft.passkey_trials.get(n, 0), plan.trials * len(plan.depths)
        say(
            f"passkey at {length_text(n)} ≥ the unscaled model's {bar:.2f} at {length_text(L)}",
            (ft.passkey[n] >= bar) if k >= full else "in progress",
            f"{ft.passkey[n]:.2f} on {k} of {full} prompts",
        )
    if not plan.jitter:
        lines.append(
            f"- (passkey at fixed depths: a length's {plan.trials * len(plan.depths)} prompts are "
            f"{len(plan.depths)} needle positions with {plan.trials} keys each, which mostly answer alike; "
            "--jitter spreads them, docs/evaluation.md)"
        )
    return lines


def evidence_dict(
    rows: list[Measured],
    plan: Plan,
    note: str,
    runtime: dict[str, str] | None = None,
    status: str = "",
    retrieval: str = "",
) -> dict[str, Any]:
    """The shipped-evidence file (``evals/measured/<model>-finetune.json``) in the frontier's format,
    with the ``runtime`` that computed its cells where known, the experiment's ``status`` (``not
    converged: ...``) where it qualifies them and its ``retrieval`` line where it measured retrieval on
    RULER's tasks."""

    def method(row: Measured) -> str:
        return "default" if row.label in ("none", CONTROL) else "yarn"

    fixed = tuple(
        replace(r, method=method(r), factor=None if method(r) == "default" else plan.factor, params={}) for r in rows
    )
    ev = Evidence("", plan.model, note, fixed)
    return shipped_dict(
        ev,
        plan.original_context,
        note,
        budget="fine-tune",
        runtime=runtime,
        passkey_jitter=plan.jitter,
        status=status,
        retrieval=retrieval,
    )
