"""LongPPL (Fang et al., arXiv 2410.23771; :mod:`.longppl`) as a suite task, one row of :mod:`.task_table`.

A suite's ``longppl:`` block scores every method at each length::

    longppl: {lengths: [16384], documents: 2, trunc_len: 4096}

One cell per method and length holds LongPPL *and* plain perplexity of the patched model on the same
windows (the first ``documents`` texts of the data that hold that many tokens, cut there), as
``ropescale eval longppl`` reports them (a suite of this row, run by the same runner; its report:
:mod:`ropescale.evals.report.longppl_folder`). The key tokens are chosen by the evaluator, by default the suite's
model itself, unscaled (the report says which): the first cell a run computes loads it beside the
suite's model, picks every length's key tokens and frees it, so every method is scored on the same
key tokens. A key token depends on the evaluator and the data only, never on the seed.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ropescale import options
from ropescale.evals.tasks.records import EvaluatorJSON, JSONValue
from ropescale.evals.tasks.task_base import (
    CellContext,
    MethodRow,
    SuiteBlock,
    SuiteError,
    Task,
    flag_type,
    positive_int,
    result_json,
    result_values,
    setting,
)

if TYPE_CHECKING:
    from ropescale.evals.tasks.longppl import LongPPLDocJSON

#: ``--trunc-len`` and ``--internal``'s defaults, the authors' (:data:`.longppl.TRUNC_LEN`, which imports
#: torch; a test ties the two)
TRUNC_LEN, INTERNAL = 4096, 1024


def _optional_text(name: str, value: Any) -> None:
    if value is not None and not isinstance(value, str):
        raise SuiteError(f"{name} must be a string or null, got {value!r}")


def _method(name: str, value: Any) -> None:
    from ropescale.methods import method_class

    if not isinstance(value, str):
        raise SuiteError(f"{name} must be a method name, got {value!r}")
    try:
        method_class(value)
    except ValueError as exc:
        raise SuiteError(f"{name}: {exc}") from None


def _optional_factor(name: str, value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, numbers.Real):
        raise SuiteError(f"{name} must be a number or null, got {value!r}")
    try:
        options.factor(value, name)
    except ValueError as exc:
        raise SuiteError(str(exc)) from None


@dataclass(frozen=True)
class LongPPLSettings:
    """``longppl:`` in a suite file; the flags of ``ropescale eval longppl`` (its scalings and lengths: the command's own)."""

    data: str | None = setting(
        None,
        "the texts: any --data value (default austen; a suite's block: the suite's data, else austen)",
        check=_optional_text,
        cli_default="austen",
    )
    documents: int = setting(
        1, "windows per length (default 1)", check=positive_int, type=flag_type(options.positive_int, None)
    )
    evaluator: str | None = setting(
        None, "checkpoint choosing key tokens (default: the evaluated model, unscaled)", check=_optional_text
    )
    evaluator_method: str = setting("none", "the evaluator's scaling (default: none)", check=_method)
    evaluator_factor: float | None = setting(
        None, "the evaluator's scaling factor", check=_optional_factor, type=flag_type(options.factor, "factor")
    )
    trunc_len: int = setting(
        TRUNC_LEN,
        "short context in tokens (default 4096)",
        check=positive_int,
        is_length=True,
        type=flag_type(options.length, None),
    )
    internal: int = setting(
        INTERNAL,
        "tokens per short window (default 1024)",
        check=positive_int,
        is_length=True,
        type=flag_type(options.length, None),
    )


def evaluator_scaling(settings: LongPPLSettings, flag: str = "--evaluator-method") -> Any:
    """The evaluator's :class:`~ropescale.scaling.Scaling` (``none``: unscaled).

    Raises:
        ValueError: a scaling method without a factor (``--evaluator-method yarn needs a factor``).
    """
    from ropescale.scaling import Scaling

    method = settings.evaluator_method
    if method.lower() in ("none", "default"):
        return Scaling("none")
    if settings.evaluator_factor is None:
        raise ValueError(f"{flag} {method} needs a factor")
    return Scaling(method, settings.evaluator_factor, {})


@dataclass
class LongPPLCell:
    """A LongPPL cell's result: LongPPL (None: the evaluator found no key token in the windows), the
    perplexity of every token of the same windows, the counts, each window's numbers, the evaluator
    and its rule (:func:`.longppl_run.evaluator_record`), and anything else a cell wrote as it was."""

    longppl: float | None
    ppl: float
    key_tokens: int = 0
    tokens: int = 0
    documents: list[LongPPLDocJSON] = field(default_factory=list)
    #: empty where a cell recorded none
    evaluator: EvaluatorJSON = field(default_factory=dict)
    #: the keys of the result's JSON it does not name, as they were read
    extra: dict[str, JSONValue] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return result_json(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LongPPLCell:
        if not isinstance(data, dict) or not {"longppl", "ppl"} <= set(data):
            raise ValueError("a LongPPL result needs 'longppl' and 'ppl'")
        named, extra = result_values(cls, data)
        return cls(**named, extra=extra)


@dataclass
class LongPPLData:
    """What a LongPPL cell reads (:meth:`LongPPL.prepare`): each length's windows, the evaluator, the
    suite's runtime settings (device, dtype, kernel) and, once the first cell ran, every window's key
    spans (the evaluator chooses them all at once, then is freed)."""

    windows: dict[int, list[tuple[str, str]]]
    judge: EvaluatorJSON
    runtime: tuple[str, str, str]
    spans: dict[int, list[list[tuple[int, int]]]] | None = None


class LongPPL(Task[LongPPLSettings, LongPPLCell]):
    name = "longppl"
    settings = LongPPLSettings
    result = LongPPLCell
    metric = "longppl"
    higher_is_better = False
    seeded = False
    command = False  # ``ropescale eval longppl`` (cli/eval_longppl.py) has its own flags (--methods) and report
    help = "LongPPL: perplexity on the key tokens that need the long context, beside perplexity"

    def prompts_per_cell(self, settings: LongPPLSettings, length: int) -> int:
        """Each document's window scored twice: by the model and by its evaluator."""
        return 2 * settings.documents

    def check(self, raw: SuiteBlock) -> None:
        """The keys one by one (:meth:`Task.check`), then what they say together: a scaled evaluator
        needs its factor, and the short window must be below every length (else no token is scored)."""
        super().check(raw)
        settings = self.read(raw)
        try:
            evaluator_scaling(settings, "longppl.evaluator_method")
        except ValueError as exc:
            raise SuiteError(f"{exc} (longppl.evaluator_factor)") from None
        lengths = raw.get("lengths")
        if isinstance(lengths, list) and all(isinstance(n, int) for n in lengths):
            short = [n for n in lengths if n <= settings.trunc_len]
            if short:
                raise SuiteError(
                    f"longppl.trunc_len {settings.trunc_len} must be below every length (got {short[0]}): "
                    "no token would be scored"
                )

    def uses_data(self, suite: Any) -> bool:
        block = suite.blocks.get(self.name) or {}
        return block.get("data") is None  # the suite's data (a block's own is in its protocol)

    def prepare(self, suite: Any, settings: LongPPLSettings, tokenizer: Any) -> LongPPLData:
        from ropescale.data.documents import load_documents
        from ropescale.evals.tasks.longppl_run import evaluator_record, text_windows

        lengths = suite.block(self.name)["lengths"]
        try:
            windows = text_windows(tokenizer, load_documents(settings.data or suite.data), lengths, settings.documents)
        except ValueError as exc:
            raise SuiteError(f"longppl {exc}") from None
        judge = evaluator_record(
            suite.model, settings.evaluator, evaluator_scaling(settings), settings.trunc_len, settings.internal
        )
        runtime = (suite.device, suite.dtype, suite.attn_implementation)
        return LongPPLData(windows, judge, runtime)

    def run_cell(self, ctx: CellContext, settings: LongPPLSettings, length: int) -> LongPPLCell:
        from ropescale.evals.tasks.longppl import combine, score_text
        from ropescale.evals.tasks.longppl_run import key_spans
        from ropescale.models.runtime import resolve_runtime

        data: LongPPLData = ctx.data
        if data.spans is None:  # once per run: every length's key tokens (kept in OUTPUT/keys/), then it is freed
            data.spans = key_spans(ctx.output, data.judge, data.windows, resolve_runtime(*data.runtime))
        spans = data.spans[length]
        docs = [
            score_text(ctx.model, ctx.tokenizer, w, spans[i], title)
            for i, (title, w) in enumerate(data.windows[length])
        ]
        return LongPPLCell.from_json({**combine(docs), "evaluator": data.judge})

    def render(self, table: Any, labels: list[str], entries: dict[str, MethodRow]) -> list[str]:
        """LongPPL, perplexity and the key-token counts per method and length (the cells' :class:`LongPPLCell`)."""
        from ropescale.evals.tasks.longppl_run import evaluator_record, evaluator_text
        from ropescale.evals.tasks.report_cells import NOT_RUN, fmt, length_table, row_name

        settings = self.read(table.settings)
        results = table.results
        judge = next((r.evaluator for rows in results.values() for r in rows.values() if r.evaluator), None)
        if judge is None:  # no cell yet: the evaluator the settings name
            judge = evaluator_record(
                "the evaluated model",
                settings.evaluator,
                evaluator_scaling(settings),
                settings.trunc_len,
                settings.internal,
            )
        lines = [
            "## LongPPL (arXiv 2410.23771)",
            "",
            f"{evaluator_text(judge)} {settings.documents} window(s) of the data per length, the same for "
            "every method; each model scores a window in one pass.",
            "",
        ]

        def rows(show) -> list[list[str]]:
            return [
                [
                    row_name(entries, label),
                    *(
                        (show(results[label][n]) if n in results[label] else "—")
                        if entries[label].runs(self.name, n)
                        else NOT_RUN
                        for n in table.lengths
                    ),
                ]
                for label in labels
            ]

        def longppl(r: LongPPLCell) -> str:
            return "n/a (no key tokens)" if r.longppl is None else fmt(r.longppl, 3)

        lines += ["LongPPL, perplexity on the key tokens (lower is better):", ""]
        lines += length_table(table.lengths, rows(longppl))
        lines += ["", "Perplexity on every token of the same windows (lower is better):", ""]
        lines += length_table(table.lengths, rows(lambda r: fmt(r.ppl, 3)))
        lines += ["", "Key tokens / tokens scored:", ""]
        lines += length_table(table.lengths, rows(lambda r: f"{r.key_tokens:,} / {r.tokens:,}"))
        return lines + [""]


LONGPPL = LongPPL()

__all__ = ["LONGPPL", "LongPPLCell", "LongPPLSettings", "evaluator_scaling"]
