"""The retrieval tasks, rows of :mod:`.task_table`: passkey retrieval (:mod:`.passkey`) and
RULER-style needles in a real-text haystack (:mod:`.needle`). Both decode greedily and score each
prompt; a cell's result is the accuracy grid over depths with every trial's record."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ropescale.evals.tasks.records import JSONValue, TrialJSON
from ropescale.evals.tasks.task_base import (
    CellContext,
    MethodRow,
    S,
    SuiteError,
    Task,
    positive_int,
    result_json,
    result_values,
    setting,
    unit_list,
)

if TYPE_CHECKING:
    from ropescale.evals.tasks.report_cells import PlotContext


def depths(text: Any, name: str = "--depths") -> tuple[float, ...]:
    """``"0,0.25,0.5"`` (a flag) or a list (a suite) -> depths in [0, 1]."""
    if isinstance(text, (list, tuple)):
        return tuple(text)
    try:
        values = tuple(float(v) for v in str(text).split(",") if v.strip())
    except ValueError:
        raise ValueError(f"{name} must be comma-separated numbers, got {text!r}") from None
    if not values or any(not 0 <= v <= 1 for v in values):
        raise ValueError(f"{name} must be numbers in [0, 1], got {text!r}")
    return values


def _jitter(name: str, value: Any) -> None:
    from ropescale.evals.tasks.passkey import check_jitter

    try:
        check_jitter(value)
    except ValueError as e:
        raise SuiteError(f"{name.rsplit('.', 1)[0]}.{e}") from None


def _needle_task(name: str, value: Any) -> None:
    from ropescale.evals.tasks.needle_tasks import TASKS

    if value not in TASKS:
        raise SuiteError(f"{name} must be one of {', '.join(TASKS)}, got {value!r}")


def _jitter_setting(differ: str) -> Any:
    """``jitter``, one meaning and default for passkey and needle (:func:`.passkey.placed_depth`)."""
    return setting(
        0.125,
        f"spread each depth's trials over depth +- JITTER, so a cell's prompts are not one position with "
        f"different {differ} (default 0.125); 0: fixed depths, as the cells of evals/measured/ before the jittered ones",
        check=_jitter,
        legacy=0.0,
        omit_at_legacy=True,
        type=float,
    )


def _trials(default: int) -> Any:
    return setting(
        default,
        f"trials at each depth: a cell has len(depths) x trials prompts (default {default})",
        check=positive_int,
        legacy=1,
        type=int,
    )


@dataclass(frozen=True)
class PasskeySettings:
    """``passkey:`` in a suite file; the flags of ``ropescale eval passkey``."""

    depths: tuple[float, ...] = setting(
        (0.0, 0.25, 0.5, 0.75, 1.0),
        "needle depths in [0, 1]",
        check=unit_list,
        legacy=[0.5],
        cli_default="0,0.25,0.5,0.75,1",
        parse=depths,
    )
    trials: int = _trials(5)
    jitter: float = _jitter_setting("keys")


@dataclass(frozen=True)
class NeedleSettings:
    """``needle:`` in a suite file; the flags of ``ropescale eval needle``."""

    task: str = setting(
        "niah_single",
        "niah_single, niah_multikey, niah_multivalue, ...",
        check=_needle_task,
        dest="needle_task",
    )
    depths: tuple[float, ...] = setting(
        (0.25, 0.5, 0.75),
        "needle depths in [0, 1]",
        check=unit_list,
        legacy=[0.5],
        cli_default="0.25,0.5,0.75",
        parse=depths,
    )
    trials: int = _trials(3)
    jitter: float = _jitter_setting("needles")


@dataclass
class RetrievalCell:
    """A retrieval cell's result: the depths × trials it decoded, the accuracy grid (one row: its
    length), per-length accuracy and trials, the threshold its context is read at, every record, and
    the rest of what :meth:`~ropescale.evals.tasks.generation.GridResult.grid_dict` wrote as it was."""

    depths: list[float]
    trials: int
    accuracy: list[list[float]]
    records: list[TrialJSON] = field(default_factory=list)
    threshold: float | None = None
    length_accuracy: dict[str, float] = field(default_factory=dict)
    length_trials: dict[str, int] = field(default_factory=dict)
    #: the keys of the result's JSON it does not name, as they were read
    extra: dict[str, JSONValue] = field(default_factory=dict)

    @property
    def partial(self) -> dict[str, int] | None:
        """A cell in progress: ``{"prompts": decoded, "of": total}`` (:meth:`Passkey.partial`); None when finished."""
        return self.extra.get("partial")

    @property
    def cell_trials(self) -> list[list[int]] | None:
        """The trials decoded at each depth (one row: the length), where the cell recorded them."""
        return self.extra.get("cell_trials")

    @property
    def length_interval(self) -> dict[str, list[float]]:
        """The 95% Wilson interval per length (keys are strings), where the cell recorded it."""
        return self.extra.get("length_interval", {})

    def to_json(self) -> dict[str, Any]:
        out = result_json(self)
        if self.threshold is None:
            out.pop("threshold")  # cells written before thresholds were recorded
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RetrievalCell:
        if not isinstance(data, dict) or not {"depths", "accuracy"} <= set(data):
            raise ValueError("a retrieval result needs 'depths' and 'accuracy'")
        values, extra = result_values(cls, data)
        values.setdefault("trials", 1)
        return cls(**values, extra=extra)


class Retrieval(Task[S, RetrievalCell]):
    result = RetrievalCell
    metric = "accuracy"
    higher_is_better = True
    retrieval = True
    decodes = True

    def prompts_per_cell(self, settings: S, length: int) -> int:
        """``len(depths) x trials`` prompts at every length."""
        return len(settings.depths) * settings.trials

    def value(self, result: RetrievalCell, length: int) -> float | None:
        from ropescale.evals.tasks.report_cells import retrieval_stats

        return retrieval_stats(result, length).accuracy

    def threshold(self) -> float:
        """The accuracy a length needs to count towards the context, for cells that did not record one."""
        raise NotImplementedError

    def title(self, settings: S) -> str:
        raise NotImplementedError

    scoring = ""
    #: what the trials at one fixed depth differ in (the report's placement line)
    differ = "the key"

    def placement(self, settings: S, results: dict[str, dict[int, RetrievalCell]]) -> str:
        from ropescale.evals.tasks.report_cells import placement_line

        return placement_line(settings, results, self.differ)

    def render(self, table: Any, labels: list[str], entries: dict[str, MethodRow]) -> list[str]:
        from ropescale.evals.tasks.report_cells import render_retrieval

        return render_retrieval(table, labels, entries)

    def plot(self, output: Path, table: Any, labels: list[str], context: PlotContext | None = None) -> list[str | None]:
        from ropescale.evals.tasks.report_cells import plot_grids

        titles = (context or {}).get("titles")
        return list(plot_grids(output, self.name, table.results, labels, table.lengths, titles))


class Passkey(Retrieval[PasskeySettings]):
    name = "passkey"
    settings = PasskeySettings
    help = "passkey retrieval at several lengths and depths"
    example = (
        "example: ropescale eval passkey --method yarn --factor 4 --lengths 4096,8192,16384 "
        "--depths 0,0.25,0.5,0.75,1 --trials 5"
    )
    scoring = "; first integer must equal the key."

    def threshold(self) -> float:
        from ropescale.evals.tasks.passkey import PASS_THRESHOLD

        return PASS_THRESHOLD

    def title(self, settings: PasskeySettings) -> str:
        return "Passkey retrieval"

    def check_lengths(self, suite: Any, settings: PasskeySettings, tokenizer: Any) -> None:
        from ropescale.evals.tasks.passkey import check_prompt_lengths

        lengths = [n for _, task, n in suite.cells() if task == self.name]
        try:
            check_prompt_lengths(tokenizer, lengths, list(settings.depths), int(settings.trials), suite.seed)
        except ValueError as exc:
            raise SuiteError(str(exc)) from None

    def prepare(self, suite: Any, settings: PasskeySettings, tokenizer: Any) -> Any:
        self.check_lengths(suite, settings, tokenizer)  # before the weights, as the dry run says it
        return None

    def run_cell(self, ctx: CellContext, settings: PasskeySettings, length: int) -> RetrievalCell:
        from ropescale.evals.tasks.passkey import run_passkey

        result = run_passkey(
            ctx.model,
            ctx.tokenizer,
            [length],
            list(settings.depths),
            int(settings.trials),
            seed=ctx.seed,
            progress=ctx.progress,
            journal=ctx.journal(),
            jitter=settings.jitter,
        )
        return RetrievalCell.from_json(result.to_dict())

    def partial(
        self, runner: Any, entry: MethodRow, length: int, settings: PasskeySettings, tokenizer: Any
    ) -> dict | None:
        from ropescale.evals.tasks.passkey import partial_passkey

        journal = runner.journal(entry, self.name, length)
        if not journal.path.is_file():
            return None
        result = partial_passkey(
            tokenizer,
            journal,
            [length],
            list(settings.depths),
            settings.trials,
            seed=runner.suite.seed,
            jitter=settings.jitter,
        )
        if result is None:
            return None
        total = len(settings.depths) * settings.trials
        return {**result.to_dict(), "partial": {"prompts": len(result.records), "of": total}}


class Needle(Retrieval[NeedleSettings]):
    name = "needle"
    settings = NeedleSettings
    help = "RULER-style multi-key / multi-value needles in a real-text haystack"
    example = "example: ropescale eval needle --task niah_multikey --method yarn --factor 4 --lengths 4096,8192"
    scoring = "; RULER string match."
    differ = "their needles and haystack"

    def threshold(self) -> float:
        from ropescale.evals.tasks.needle_tasks import RULER_THRESHOLD

        return RULER_THRESHOLD

    def title(self, settings: NeedleSettings) -> str:
        return f"Needle suite ({settings.task})"

    def uses_data(self, suite: Any) -> bool:
        return suite.data is not None  # the haystack: the suite's text, else the built-in one

    def prepare(self, suite: Any, settings: NeedleSettings, tokenizer: Any) -> Any:
        if suite.data is None:
            return None
        from ropescale.data.documents import load_documents

        return [text for _, text in load_documents(suite.data)]

    def run_cell(self, ctx: CellContext, settings: NeedleSettings, length: int) -> RetrievalCell:
        from ropescale.evals.tasks.needle import run_needle

        result = run_needle(
            ctx.model,
            ctx.tokenizer,
            settings.task,
            [length],
            list(settings.depths),
            int(settings.trials),
            seed=ctx.seed,
            haystack=ctx.data,
            progress=ctx.progress,
            journal=ctx.journal(),
            jitter=settings.jitter,
        )
        return RetrievalCell.from_json(result.to_dict())


PASSKEY = Passkey()
NEEDLE = Needle()

__all__ = ["NEEDLE", "PASSKEY", "NeedleSettings", "PasskeySettings", "RetrievalCell", "depths"]
