"""What a recommended method costs and gains, read off measured results: typed records, then sentences.

:func:`measure` finds, for one method, four comparisons in the evidence (the first source that has
each): its perplexity at a short length against the unscaled model, its perplexity at a long length
against every other method measured there, its passkey accuracy per length, and, for YaRN, what
``attention_factor=1.0`` trades. Each is a frozen record naming its source; :meth:`sentence` renders
it for ``ropescale recommend --verbose``. Lengths are read relative to each source's own trained
context L': short inputs at the shortest length ≤ L', long ones at the longest length ≤ s·L'
(s = target / original context; the longest measured if none is that short), passkey at the lengths
≤ s·L'.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ropescale.evals.advice.evidence import CONTROL, FINE_TUNED, Evidence, Measured
from ropescale.evals.advice.evidence import length_text as _k
from ropescale.evals.advice.records import Params
from ropescale.evals.tasks.proportions import difference_interval
from ropescale.rope_math import yarn_mscale


@dataclass(frozen=True)
class ShortCost:
    """Perplexity at the shortest common length ≤ L, against the unscaled model."""

    row: Measured
    base: Measured
    length: int
    source: Evidence

    def sentence(self) -> str:
        new, old = self.row.ppl[self.length], self.base.ppl[self.length]
        cost = "no cost" if abs(new / old - 1) < 0.005 else f"{100 * (new / old - 1):+.0f}%"
        return (
            f"short inputs: PPL {new:.2f} at {_k(self.length)} vs {old:.2f} unscaled ({cost}; "
            f"{self.row.title}, {self.source.source})"
        )


@dataclass(frozen=True)
class LongPerplexity:
    """Perplexity at the longest length measured, against every other method measured there."""

    row: Measured
    length: int
    others: tuple[Measured, ...]
    source: Evidence

    def sentence(self) -> str:
        n = self.length
        listed = ", ".join(f"{r.label} {num(r.ppl[n])}" for r in sorted(self.others, key=lambda r: r.ppl[n]))
        return (
            f"long inputs: PPL {num(self.row.ppl[n])} at {_k(n)} ({self.row.title}) vs {listed} ({self.source.source})"
        )


@dataclass(frozen=True)
class PasskeyAccuracy:
    """Passkey accuracy per length (the unscaled model's beside it where measured)."""

    row: Measured
    base: Measured | None
    lengths: tuple[int, ...]
    source: Evidence

    def sentence(self) -> str:
        base = self.base
        acc = ", ".join(
            f"{self.row.passkey[n]:.0%} at {_k(n)}"
            + (f" (unscaled {base.passkey[n]:.0%})" if base and n in base.passkey else "")
            for n in self.lengths
        )
        return f"passkey: {acc} ({self.row.title}, {self.source.source})"

    def losses(self, original_context: int) -> str:
        """The retrieval line of the short answer: where the method finds fewer keys than the model as
        trained (its cell at the same length up to the source's trained context L', at L' beyond, where
        the unscaled model cannot reach), beyond the noise of the prompts where their number is known."""
        row, base, L = self.row, self.base, self.source.original_context or original_context
        native = max((n for n in (base.passkey if base else {}) if n <= L), default=None)

        def cell(r: Measured, n: int) -> str:  # correct/prompts where their number is known
            k = r.passkey_trials.get(n)
            return f"{round(r.passkey[n] * k)}/{k}" if k else f"{r.passkey[n]:.0%}"

        lost, noise, kept = [], [], []
        for n in self.lengths:
            ref = n if base and n in base.passkey and n <= L else native
            if ref is None or row.passkey[n] >= base.passkey[ref]:
                kept.append(f"{_k(n)} {cell(row, n)}")
                continue
            text = f"{_k(n)} {cell(row, n)} (unscaled {cell(base, ref)}{'' if ref == n else ' at ' + _k(ref)})"
            a, b = row.passkey_trials.get(n), base.passkey_trials.get(ref)
            clear = not (a and b) or difference_interval(base.passkey[ref] * b, b, row.passkey[n] * a, a)[0] > 0
            (lost if clear else noise).append(text)
        said = [f"lost at {', '.join(lost)}"] * bool(lost)
        said += [f"lower within its prompts' noise at {', '.join(noise)}"] * bool(noise)
        said += [f"{'kept' if base else 'measured'} at {', '.join(kept)}"] * bool(kept)
        return f"passkey {'; '.join(said)} ({row.title}, {self.source.source})"


@dataclass(frozen=True)
class YarnTemperature:
    """YaRN with ``attention_factor=1.0`` against its default temperature."""

    row: Measured
    alt: Measured
    source: Evidence

    def sentence(self) -> str:
        row, alt = self.row, self.alt
        pk = ", ".join(f"{alt.passkey[n]:.0%}" for n in sorted(alt.passkey))
        pk_default = ", ".join(f"{row.passkey[n]:.0%}" if n in row.passkey else "—" for n in sorted(alt.passkey))
        ppl = ", ".join(
            f"{alt.ppl[n]:.1f} vs {row.ppl[n]:.1f} at {_k(n)}" for n in sorted(n for n in alt.ppl if n in row.ppl)
        )
        return (
            f"YaRN's attention temperature ({yarn_mscale(row.factor or 1):.3f} at ×{row.factor or 1:g}) trades "
            f"retrieval for long-context PPL: attention_factor=1.0 gives passkey {pk} "
            f"at {'/'.join(_k(n) for n in sorted(alt.passkey))} (default {pk_default}) but PPL {ppl} "
            f"({self.source.source}): use it for retrieval, the default for long-document language modelling"
        )


Tradeoff = ShortCost | LongPerplexity | PasskeyAccuracy | YarnTemperature


def measure(
    method: str,
    evidence: list[Evidence],
    original_context: int,
    target_length: int | None = None,
    params: Params | None = None,
) -> list[Tradeoff]:
    """The comparisons for ``method`` with exactly ``params`` (None: its defaults) found in ``evidence``
    (sources measured at this very factor first): Self-Extend with group 8 and log-n is not the default
    Self-Extend, whose passkey may be another story. Of a fine-tune experiment only its training-free rows
    count: its fine-tuned and control models are others."""
    params = dict(params or {})
    scale = (target_length or math.inf) / original_context
    evidence = [
        replace(ev, rows=tuple(r for r in ev.rows if r.label not in (FINE_TUNED, CONTROL)))
        if ev.budget == "fine-tune"
        else ev
        for ev in evidence
    ]

    def exact(ev: Evidence) -> bool:
        row = ev.find(method, factor=scale, **params)
        return row is not None and row.at_factor(scale)

    evidence = sorted(evidence, key=lambda ev: not exact(ev))

    def upto(ev: Evidence, lengths) -> list[int]:
        inside = sorted(n for n in lengths if n <= scale * (ev.original_context or original_context))
        return inside or sorted(lengths)

    def short(ev: Evidence) -> ShortCost | None:
        row, base = ev.find(method, factor=scale, **params), ev.find("default")
        if not (row and base):
            return None
        common = sorted(n for n in row.ppl if n in base.ppl and n <= (ev.original_context or original_context))
        return ShortCost(row, base, common[0], ev) if common else None

    def long(ev: Evidence) -> LongPerplexity | None:
        row = ev.find(method, factor=scale, **params)
        if not row or not row.ppl:
            return None
        n = max(upto(ev, row.ppl))
        others = tuple(r for r in ev.rows if n in r.ppl and r is not row and not r.params)
        return LongPerplexity(row, n, others, ev) if others else None

    def passkey(ev: Evidence) -> PasskeyAccuracy | None:
        row, base = ev.find(method, factor=scale, **params), ev.find("default")
        return PasskeyAccuracy(row, base, tuple(upto(ev, row.passkey)), ev) if row and row.passkey else None

    def temperature(ev: Evidence) -> YarnTemperature | None:
        row, alt = ev.find("yarn"), ev.find("yarn", attention_factor=1.0)
        return YarnTemperature(row, alt, ev) if row and alt else None

    yarn = method == "yarn" and not params
    finders: list[Callable[[Evidence], Any]] = [short, long, passkey] + ([temperature] if yarn else [])
    found = (next((hit for ev in evidence if (hit := find(ev))), None) for find in finders)
    return [hit for hit in found if hit is not None]


def tradeoffs(
    method: str,
    evidence: list[Evidence],
    original_context: int,
    target_length: int | None = None,
    params: Params | None = None,
) -> list[tuple[str, Evidence]]:
    """:func:`measure` rendered: (sentence, the evidence it was read from) per comparison."""
    return [(t.sentence(), t.source) for t in measure(method, evidence, original_context, target_length, params)]


def num(x: float) -> str:
    return f"{x:.2f}" if x < 1000 else f"{x:.4g}"
