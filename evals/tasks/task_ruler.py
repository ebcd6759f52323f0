"""RULER's offline tasks (arXiv 2404.06654; :mod:`.ruler`) as a suite task, one row of :mod:`.task_table`.

A suite's ``ruler:`` block runs the battery at each length::

    ruler: {tasks: [niah_single_1, vt, cwe], samples: 30, lengths: [4096, 16384]}

One cell per method and length holds every task of the battery (:class:`RulerBattery`), each a
:class:`~.ruler.cell.RulerCell` decoded by :func:`~.ruler.cell.run_ruler_cell` with its own prompt
journal, so an interrupted cell resumes at its first undecoded prompt. ``ropescale eval ruler`` is a
one-method suite of this row, run by the same runner (its report: :mod:`ropescale.evals.report.ruler_folder`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ropescale import options
from ropescale.evals.tasks.ruler.prompt import PROMPTS
from ropescale.evals.tasks.task_base import (
    CellContext,
    MethodRow,
    SuiteError,
    Task,
    flag_type,
    one_of,
    optional_int,
    positive_int,
    setting,
)

if TYPE_CHECKING:
    from ropescale.evals.tasks.ruler.cell import RulerCell
    from ropescale.evals.tasks.ruler.tasks import RulerTask

DEFAULT_TASKS = ("niah_single_1", "niah_multikey_2", "niah_multikey_3", "vt", "cwe", "fwe")


def task_names(value: Any, name: str = "--tasks") -> tuple[str, ...]:
    """``"vt,cwe"`` (a flag) or a list (a suite) -> task names."""
    items = value.split(",") if isinstance(value, str) else list(value)
    return tuple(str(t).strip() for t in items if str(t).strip())


def _check_tasks(name: str, value: Any) -> None:
    from ropescale.evals.tasks.ruler.tasks import get_task

    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(t, str) for t in value):
        raise SuiteError(f"{name} must be a non-empty list of RULER task names, got {value!r}")
    for t in value:
        try:
            get_task(t)
        except ValueError as exc:
            raise SuiteError(f"{name}: {' '.join(str(exc).split())}") from None


def _check_haystack(name: str, value: Any) -> None:
    if not isinstance(value, str) or not value.partition(":")[0]:
        raise SuiteError(f"{name} must be CORPUS:TITLE (e.g. austen:Emma), got {value!r}")


@dataclass(frozen=True)
class RulerSettings:
    """``ruler:`` in a suite file; the flags of ``ropescale eval ruler`` (but ``--seed``, its own)."""

    tasks: tuple[str, ...] = setting(
        DEFAULT_TASKS,
        "RULER tasks, comma-separated",
        check=_check_tasks,
        cli_default=",".join(DEFAULT_TASKS),
        parse=task_names,
    )
    samples: int = setting(
        30, "prompts per cell (default 30)", check=positive_int, type=flag_type(options.positive_int, "--samples")
    )
    seed: int | None = setting(None, "seed of lm-eval's generators (default: the suite's)", check=optional_int)
    haystack: str = setting("austen:Emma", "prose of the [austen] variants: CORPUS:TITLE", check=_check_haystack)
    prompt: str = setting(
        "plain",
        "plain: lm-eval's text as it is (default); chat: in the tokenizer's chat template, as RULER runs "
        "instruct models (a row of its own, compared with the unscaled model's chat cells)",
        check=one_of(*PROMPTS),
        legacy="plain",
        omit_at_legacy=True,
        choices=PROMPTS,
    )


@dataclass
class RulerBattery:
    """A RULER cell of a suite: every task of the battery at one length."""

    cells: dict[str, RulerCell] = field(default_factory=dict)  # task name -> its cell
    #: the lm-eval whose generators wrote the prompts and whose metric scored them (None: not recorded)
    lm_eval_version: str | None = None

    @property
    def score(self) -> float:
        """The mean over tasks of each task's mean score (0-1)."""
        return sum(c.score for c in self.cells.values()) / len(self.cells) if self.cells else 0.0

    def to_json(self) -> dict[str, Any]:
        out = {"score": self.score, "tasks": {name: cell.to_dict() for name, cell in self.cells.items()}}
        return {**out, **({"lm_eval_version": self.lm_eval_version} if self.lm_eval_version else {})}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RulerBattery:
        from ropescale.evals.tasks.ruler.cell import RulerCell

        if not isinstance(data, dict) or not isinstance(data.get("tasks"), dict):
            raise ValueError("a RULER result needs 'tasks'")
        version = data.get("lm_eval_version")
        cells = {name: RulerCell.from_dict(cell) for name, cell in data["tasks"].items()}
        return cls(cells, version if isinstance(version, str) else None)


@dataclass(frozen=True)
class RulerData:
    """What a RULER cell reads (:meth:`Ruler.prepare`): the battery's tasks, the essay haystack's words
    (None: no task of the battery reads prose) and each task's samples per length, generated from the
    tokenizer before the weights load (a cell lm-eval fills short is refused then, not after loading)."""

    tasks: list[RulerTask]
    essay: list[str] | None
    docs: dict[tuple[str, int], Any] = field(default_factory=dict)


def essay_text(spec: str) -> str:
    """The text of ``CORPUS:TITLE`` (the held-out novel of the [austen] variants)."""
    from ropescale.data.documents import load_documents

    corpus, _, title = spec.partition(":")
    docs = load_documents(corpus)
    for name, text in docs:
        if not title or name.lower() == title.lower():
            return text
    raise ValueError(f"haystack {spec!r}: no document titled {title!r} in {corpus!r} ({', '.join(n for n, _ in docs)})")


class Ruler(Task[RulerSettings, RulerBattery]):
    name = "ruler"
    settings = RulerSettings
    result = RulerBattery
    metric = "score"
    higher_is_better = True
    decodes = True  # lm-eval's generate_until: every prompt answers
    command = False  # ``ropescale eval ruler`` (cli/eval_ruler.py) has its own flags (--method, --seed) and report
    help = "RULER's offline synthetic tasks (needles, variable tracking, common/frequent words)"

    def prompts_per_cell(self, settings: RulerSettings, length: int) -> int:
        """Every task of the battery, ``samples`` prompts each."""
        return settings.samples * max(1, len(settings.tasks))

    def prepare(self, suite: Any, settings: RulerSettings, tokenizer: Any) -> RulerData:
        from ropescale.evals.tasks.ruler.prompt import check_prompt
        from ropescale.evals.tasks.ruler.tasks import check_fits, essay_haystack, get_task

        try:
            check_prompt(settings.prompt, tokenizer, str(suite.model))
        except ValueError as exc:
            raise SuiteError(f"ruler.prompt: {exc}") from None
        tasks = [get_task(t) for t in settings.tasks]
        essay = None
        if any(t.haystack == "essay" for t in tasks):
            try:
                essay = essay_haystack(essay_text(settings.haystack))
            except ValueError as exc:
                raise SuiteError(f"ruler.{exc}") from None
        lengths = suite.block(self.name)["lengths"]
        for task in tasks:  # a length lm-eval's generators cannot fill: said before the weights load
            for length in lengths:
                check_fits(task, tokenizer, length, essay)
        from ropescale.evals.tasks.ruler.cell import cell_docs

        seed = suite.seed if settings.seed is None else settings.seed
        docs = {  # a cell lm-eval fills short: said before the weights load
            (t.name, n): cell_docs(t, tokenizer, n, settings.samples, seed, essay, settings.prompt)
            for t in tasks
            for n in lengths
        }
        return RulerData(tasks, essay, docs)

    def run_cell(self, ctx: CellContext, settings: RulerSettings, length: int) -> RulerBattery:
        from importlib.metadata import version

        from ropescale.evals.tasks.ruler.cell import run_ruler_cell

        seed = ctx.seed if settings.seed is None else settings.seed
        battery = RulerBattery(lm_eval_version=version("lm_eval"))  # the generators' version: the prompts' source
        data: RulerData = ctx.data
        for task in data.tasks:
            battery.cells[task.name] = run_ruler_cell(
                ctx.model,
                ctx.tokenizer,
                task,
                length,
                settings.samples,
                seed,
                data.essay,
                journal=ctx.journal(task.name),
                progress=ctx.progress,
                prompt=settings.prompt,
                docs=data.docs.get((task.name, length)),
            )
            if not ctx.progress:  # a log: one cell of the battery is hours at 32k on a CPU, so a line per task
                cell = battery.cells[task.name]
                low, high = cell.interval
                print(
                    f"  {task.name} ({ctx.entry.title} at {length:,}): {100 * cell.score:.1f} "
                    f"[{100 * low:.0f}, {100 * high:.0f}] on {len(cell.records)} prompts ({cell.elapsed_s:.0f} s)",
                    flush=True,
                )
        return battery

    def render(self, table: Any, labels: list[str], entries: dict[str, MethodRow]) -> list[str]:
        """The battery's mean score per method and length, then each task's (the cells' :class:`RulerBattery`:
        scores recomputed from the records, as its file's ``score`` was when it was written)."""
        from ropescale.evals.tasks.report_cells import NOT_RUN, length_table, row_name

        settings = self.read(table.settings)
        results: dict[str, dict[int, RulerBattery]] = table.results
        lines = [
            "## RULER",
            "",
            f"Tasks {', '.join(settings.tasks)}, {settings.samples} prompts each per length, as lm-eval generates "
            "and scores them (string_match_all), decoded greedily on the patched model"
            + (", each prompt in the model's chat template (prompt: chat)." if settings.prompt == "chat" else "."),
            "",
            "Mean score over the tasks (higher is better):",
            "",
        ]
        rows = [
            [
                row_name(entries, label),
                *(
                    (f"{results[label][n].score:.2f}" if n in results[label] else "—")
                    if entries[label].runs(self.name, n)
                    else NOT_RUN
                    for n in table.lengths
                ),
            ]
            for label in labels
        ]
        lines += length_table(table.lengths, rows)
        lines += ["", "Per task (score at each length):", ""]
        for label in labels:
            for task in settings.tasks:
                scores = (
                    f"{results[label][n].cells[task].score:.2f}"
                    if n in results[label] and task in results[label][n].cells
                    else "—"
                    for n in table.lengths
                )
                lines.append(f"- {row_name(entries, label)} {task}: " + ", ".join(scores))
        return lines + [""]


RULER = Ruler()
