"""The perplexity task: sliding-window perplexity of the suite's documents at each length
(:func:`ropescale.scoring.perplexity.evaluate_perplexity`), one row of :mod:`.task_table`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ropescale import options
from ropescale.evals.tasks.records import JSONValue
from ropescale.evals.tasks.task_base import (
    CellContext,
    MethodRow,
    SuiteError,
    Task,
    flag_type,
    one_of,
    optional_positive_int,
    result_json,
    result_values,
    setting,
)

if TYPE_CHECKING:
    from ropescale.evals.tasks.report_cells import PlotContext

#: the window protocols (:data:`ropescale.scoring.perplexity.MODES`, which imports torch; a test ties the two)
MODES = ("yarn", "longlora", "nonoverlap")
#: what a cell's token budget bounds (``budget``): the cell's tokens, or each document's (before the key)
BUDGETS = ("cell", "document")


@dataclass(frozen=True)
class PerplexitySettings:
    """``perplexity:`` in a suite file; the flags of ``ropescale eval perplexity``."""

    mode: str = setting(
        "yarn",
        "window protocol: yarn (PI/YaRN, stride 256, each token once), longlora (every token of windows every "
        "STRIDE), nonoverlap (lm-eval rolling)",
        check=one_of(*MODES),
        choices=list(MODES),
    )
    stride: int | None = setting(
        None,
        "window stride in tokens (default 256; window for nonoverlap)",
        check=optional_positive_int,
        is_length=True,
        type=flag_type(options.length, "--stride"),
    )
    max_tokens: int | None = setting(
        None,
        "tokens scored per cell (default: 4 windows of the length); see budget",
        check=optional_positive_int,
        is_length=True,
        type=flag_type(options.length, "--max-tokens"),
    )
    budget: str = setting(
        "cell",
        "what max_tokens bounds: cell (the tokens the cell scores, the documents taken in order until it is "
        "spent; default) or document (each document's first max_tokens, as every cell before this key was "
        "scored: a cell of several documents scored more)",
        check=one_of(*BUDGETS),
        legacy="document",
        omit_at_legacy=True,
        choices=list(BUDGETS),
    )


@dataclass
class PerplexityCell:
    """A perplexity cell's result: the numbers the report reads, typed, and the rest of what
    :class:`~ropescale.scoring.perplexity.PerplexityResult` wrote (window NLLs, timing) as it was."""

    ppl: float
    mean_window_ppl: float | None = None
    tokens_scored: int = 0
    mode: str = "yarn"
    window: int | None = None
    stride: int | None = None
    #: the keys of the result's JSON it does not name, as they were read
    extra: dict[str, JSONValue] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return result_json(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PerplexityCell:
        if not isinstance(data, dict) or "ppl" not in data:
            raise ValueError("a perplexity result needs 'ppl'")
        named, extra = result_values(cls, data)
        return cls(**named, extra=extra)


def cell_documents(documents: list[list[int]], budget: int, window: int) -> list[list[int]]:
    """The documents a cell scores when ``budget`` bounds the cell: taken in order, the last one cut where
    the budget is spent, a remainder shorter than one window left out (it holds no window), so that a
    cell of ``max_tokens: 131072`` scores at most 131,072 tokens however many documents the data holds."""
    out, left = [], budget
    for doc in documents:
        if left < window:
            break
        out.append(doc[:left])
        left -= len(out[-1])
    return out


class Perplexity(Task[PerplexitySettings, PerplexityCell]):
    name = "perplexity"
    settings = PerplexitySettings
    result = PerplexityCell
    metric = "ppl"
    higher_is_better = False
    seeded = False
    help = "sliding-window perplexity at several lengths"
    example = (
        "example: ropescale eval perplexity --methods none,linear,ntk,dynamic_ntk,yarn --factor 4 "
        "--lengths 2048,8192,16384 --output runs/ppl"
    )

    def uses_data(self, suite: Any) -> bool:
        return True

    def prompts_per_cell(self, settings: PerplexitySettings, length: int) -> int:
        """Windows of ``length`` over the tokens scored (4 windows' worth unless ``max_tokens``), one per stride."""
        scored = max(length, int(settings.max_tokens or 4 * length))  # the cell's budget, as run_cell takes it
        stride = settings.stride or (length if settings.mode == "nonoverlap" else 256)
        return max(1, math.ceil(scored / stride))

    def prepare(self, suite: Any, settings: PerplexitySettings, tokenizer: Any) -> Any:
        from ropescale.data.documents import load_documents, tokenize_documents

        longest = max(suite.block(self.name)["lengths"])
        budget = int(settings.max_tokens or 4 * longest)
        documents = tokenize_documents(tokenizer, load_documents(suite.data), max_tokens=max(budget, longest) * 2)
        have = max((len(d) for d in documents), default=0)
        if have < longest:
            raise SuiteError(
                f"perplexity length {longest} is larger than the longest document of the data ({have} tokens)"
            )
        return documents

    def run_cell(self, ctx: CellContext, settings: PerplexitySettings, length: int) -> PerplexityCell:
        from ropescale.scoring.perplexity import evaluate_perplexity

        budget = max(length, int(settings.max_tokens or 4 * length))
        documents = [d for d in ctx.data if len(d) >= length]
        if settings.budget == "cell":
            documents = cell_documents(documents, budget, length)
        result = evaluate_perplexity(
            ctx.model,
            documents,
            window=length,
            stride=settings.stride,
            mode=settings.mode,
            bos_token_id=ctx.tokenizer.bos_token_id,
            max_tokens=budget,
            progress=ctx.progress,
        )
        out = result.to_dict()
        out.pop("window_document", None)
        return PerplexityCell.from_json(out)

    def render(self, table: Any, labels: list[str], entries: dict[str, MethodRow]) -> list[str]:
        from ropescale.evals.tasks.report_cells import render_perplexity

        return render_perplexity(table, labels, entries)

    def plot(self, output: Path, table: Any, labels: list[str], context: PlotContext | None = None) -> list[str | None]:
        from ropescale.evals.tasks.report_cells import plot_ppl

        return [plot_ppl(output, table.results, labels, table.lengths, **(context or {}))]


PERPLEXITY = Perplexity()
