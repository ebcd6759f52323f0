"""The frontier's records: the native model's numbers (:class:`Reference`) and one method read against
them (:class:`FrontierVerdict`). :mod:`.frontier` makes them and :mod:`.frontier_bar` reads them; they
live apart from both so that each imports them without importing the other."""

from __future__ import annotations

from dataclasses import dataclass, field

from ropescale.evals.advice.evidence import Measured

#: prompts per passkey length from which a retrieval verdict is a sample rather than a hint (25 tells
#: 0.8 from 0.4: 20/25 reads [0.61, 0.91], 10/25 [0.23, 0.59]; `ropescale eval passkey`'s default grid)
FEW_PROMPTS = 25


@dataclass(frozen=True)
class FrontierVerdict:
    """One method read against the native model (None where the evidence does not say)."""

    row: Measured
    ppl_ratio: float | None  # worst long-length perplexity / native perplexity at L
    short_ratio: float | None  # worst perplexity / native perplexity at the same length, lengths ≤ L
    passkey_min: float | None  # worst passkey accuracy over the lengths ≤ N
    passkey_cells: tuple[tuple[int, float, int | None, tuple[float, float] | None], ...]  # (n, acc, trials, ci)
    keeps_ppl: bool | None
    keeps_retrieval: bool | None
    pareto: bool = False

    @property
    def keeps_both(self) -> bool:
        return bool(self.keeps_ppl and self.keeps_retrieval)

    @property
    def confirmed(self) -> bool:
        """Whether every passkey cell holds at least :data:`FEW_PROMPTS` prompts (enough to tell
        0.8 from 0.4), so that "keeps retrieval" rests on a sample, not only on "not shown lost"."""
        return bool(self.passkey_cells) and all((t or 0) >= FEW_PROMPTS for _, _, t, _ in self.passkey_cells)

    @property
    def passkey_floor(self) -> float:
        """The lowest 95% Wilson lower bound over the passkey cells (the point estimate where a cell
        has no trial count; 0 without cells): how much retrieval the evidence guarantees."""
        return min((ci[0] if ci else acc for _, acc, _, ci in self.passkey_cells), default=0.0)

    @property
    def worst_ratio(self) -> float | None:
        """The Pareto view's perplexity axis: the worse of the long and the short ratio."""
        ratios = [r for r in (self.ppl_ratio, self.short_ratio) if r is not None]
        return max(ratios) if self.ppl_ratio is not None else None


@dataclass(frozen=True)
class Reference:
    """The native model's numbers the verdicts are read against."""

    ppl_length: int
    ppl: float
    passkey_length: int | None
    passkey: float | None
    passkey_within: dict[int, float] = field(default_factory=dict)  # native accuracy at each length ≤ L

    def passkey_bar(self, n: int) -> float | None:
        """The native accuracy a method's passkey at ``n`` tokens is read against: native at ``n``
        when ``n`` ≤ L is measured there, else native at L."""
        return self.passkey_within.get(n, self.passkey)
