"""What an evaluation task is, for the one table of tasks (:mod:`.task_table`).

A task kind is one object, a :class:`Task`, that says everything the suite runner, the suite's
checks, its cell keys, the command line and the report need to know about it:

A row is declared ``Task[XSettings, XResult]`` (``class Perplexity(Task[PerplexitySettings, PerplexityCell])``):
the two type parameters are its ``settings`` and ``result`` classes, so that :meth:`Task.read` returns the
row's settings and :meth:`Task.run_cell` its result to a type checker, as they do at run time.

- ``settings``: a dataclass whose fields (made with :func:`setting`) are the task's keys in a suite
  file (``passkey: {depths: ..., trials: ...}``) *and* the flags of ``ropescale eval <task>``, each
  with its default, its check and its help, written once;
- ``result``: the typed result of one cell, with ``to_json``/``from_json`` (a cell file's ``result``);
- ``metric`` and ``higher_is_better``: the number a cell is judged by;
- :meth:`Task.prepare` (what the task reads before the weights load: documents, a haystack),
  :meth:`Task.run_cell` (one method at one length) and :meth:`Task.render` (its report section).

Nothing here imports torch: the command line builds its parsers from these fields.
"""

from __future__ import annotations

import numbers
from dataclasses import MISSING, Field, asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypedDict, TypeVar

from ropescale.errors import RopescaleError

# a task's block of a suite file: its settings by name, as the file writes them (each task has its own keys)
from ropescale.evals.tasks.run_folder import Settings as SuiteBlock
from ropescale.options import option

if TYPE_CHECKING:
    from ropescale.evals.tasks.report_cells import PlotContext


#: a row's settings dataclass (``PerplexitySettings``)
S = TypeVar("S")
#: a row's typed cell result (``PerplexityCell``)
R = TypeVar("R")


class SuiteError(RopescaleError):
    """A suite file or its combination of settings is invalid (also ``ropescale.evals.suite.runner.SuiteError``)."""


def setting(
    default: Any = MISSING,
    help: str = "",
    *,
    check: Any = None,
    legacy: Any = MISSING,
    omit_at_legacy: bool = False,
    is_length: bool = False,
    **cli: Any,
) -> Any:
    """A task setting: a dataclass field that is a suite key and an ``ropescale eval <task>`` flag.

    Args:
        default: the value when the suite or the command line gives none (the one default).
        help: the flag's help.
        check: ``check(name, value)`` raising :class:`SuiteError` for a value of the wrong kind (``name``
            is ``task.key``, as the message names it).
        legacy: what an absent key meant before this default was set (results version 1): a cell of a
            suite that gives no value is keyed with the default where the two differ, so it is never
            taken for a cell measured the old way, and old cells still match the explicit old value.
        omit_at_legacy: leave the key out of a cell's protocol when it equals ``legacy`` (passkey's
            ``jitter: 0``, which cells of the fixed placement never recorded).
        is_length: the value is a length in tokens (``4k`` is read as 4096 in a suite file).
        cli: :func:`ropescale.options.option`'s flag options (``type``, ``choices``, ``parse``...).
    """
    suite = SuiteMeta(check=check, legacy=legacy, omit=omit_at_legacy, length=is_length)
    return option(default, help=help, suite=suite, **cli)


class SuiteMeta(TypedDict, total=False):
    """What :func:`setting` keeps in a field's metadata for the suite (a field made otherwise has none)."""

    #: ``check(name, value)``, raising :class:`SuiteError` (None: any value)
    check: Any
    #: what an absent key meant before the default was set (``MISSING``: the default always was)
    legacy: Any
    #: leave the key out of a cell's protocol when it equals ``legacy``
    omit: bool
    #: a length in tokens (``4k`` read as 4096)
    length: bool


def suite_meta(f: Field) -> SuiteMeta:
    return f.metadata.get("suite") or SuiteMeta()


def default_of(f: Field) -> Any:
    """A field's default as a suite file writes it (tuples as lists)."""
    value = f.default
    return list(value) if isinstance(value, tuple) else value


# -- the checks a setting may name ------------------------------------------------------------------
def _int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def positive_int(name: str, value: Any) -> None:
    if not _int(value) or value <= 0:
        raise SuiteError(f"{name} must be a positive integer, got {value!r}")


def optional_positive_int(name: str, value: Any) -> None:
    if value is not None and (not _int(value) or value <= 0):
        raise SuiteError(f"{name} must be a positive integer or null, got {value!r}")


def unit_list(name: str, value: Any) -> None:
    ok = isinstance(value, (list, tuple)) and value
    ok = ok and all(isinstance(d, numbers.Real) and not isinstance(d, bool) and 0 <= d <= 1 for d in value)
    if not ok:
        raise SuiteError(f"{name} must be a non-empty list of numbers in [0, 1], got {value!r}")


def one_of(*choices: str) -> Any:
    def check(name: str, value: Any) -> None:
        if value not in choices:
            raise SuiteError(f"{name} must be one of {', '.join(choices)}, got {value!r}")

    return check


def optional_int(name: str, value: Any) -> None:
    if value is not None and not _int(value):
        raise SuiteError(f"{name} must be an integer or null, got {value!r}")


def flag_type(parse: Any, name: str) -> Any:
    """An argparse ``type=`` from a :mod:`ropescale.options` parser (its ValueError as a usage error)."""
    import argparse

    def convert(text: str) -> Any:
        try:
            return parse(text, name)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


def result_json(result: Any) -> dict[str, Any]:
    """A typed result (a dataclass with an ``extra`` field) as its JSON: the keys it was read with that
    it does not name, then its fields."""
    return {**result.extra, **{k: v for k, v in asdict(result).items() if k != "extra"}}


def result_values(cls: type, data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``data`` split for ``cls(**named, extra=extra)``: the values of its fields found in ``data``, and the
    rest, kept as it was (a result written by another version keeps what this one does not name)."""
    named = {f.name for f in fields(cls)} - {"extra"}
    return {k: data[k] for k in named if k in data}, {k: v for k, v in data.items() if k not in named}


class MethodRow(Protocol):
    """What a task reads of a suite's method entry (the suite's ``MethodEntry``,
    a room above: named here by what it offers)."""

    label: str
    method: str

    def runs(self, task: str, length: int) -> bool: ...


@dataclass
class CellContext:
    """What one cell runs with: the patched model, its tokenizer, the method entry, the suite's seed,
    the task's prepared data (:meth:`Task.prepare`), the cell's prompt journals (resuming) and the results folder."""

    model: Any
    tokenizer: Any
    entry: MethodRow
    seed: int
    data: Any
    progress: bool
    journal_for: Any  # suffix -> PromptJournal ("" the cell's own, "x" a second one beside it)
    #: the results folder, where a task keeps what its cells share across runs (LongPPL's key tokens)
    output: Path | None = None

    def journal(self, suffix: str = "") -> Any:
        return self.journal_for(suffix)


class Task(Generic[S, R]):
    """One row of the table of tasks, ``Task[XSettings, XResult]``; subclass it in the task's own file
    and add it to :data:`.task_table.TABLE` (or :func:`.task_table.register` it)."""

    name: ClassVar[str]
    #: the settings dataclass (``S``); a class attribute of each row (ClassVar cannot hold a type variable)
    settings: type[S]
    #: the result class (``R``), with ``to_json``/``from_json``
    result: type[R]
    metric: ClassVar[str]
    higher_is_better: ClassVar[bool]
    #: a pass/fail accuracy per cell: the report adds Wilson intervals, context and accuracy grids
    retrieval: ClassVar[bool] = False
    #: a cell's prompts generate an answer after their prefill (a plan counts the KV cache and the decoding)
    decodes: ClassVar[bool] = False
    #: the suite's seed draws the task's prompts, so it is part of a cell's protocol
    seeded: ClassVar[bool] = True
    help: ClassVar[str] = ""
    example: ClassVar[str] = ""
    #: a ``ropescale eval <name>`` command of its own is built from the settings (False: the task has one)
    command: ClassVar[bool] = True

    # -- settings ---------------------------------------------------------------------------------
    def keys(self) -> tuple[str, ...]:
        """The keys of the task's block in a suite file."""
        return ("lengths", *(f.name for f in fields(self.settings)))

    def read(self, raw: SuiteBlock) -> S:
        """The typed settings of a (checked) suite block: its values over the defaults."""
        values = {}
        for f in fields(self.settings):
            if f.name in raw:
                value = raw[f.name]
                values[f.name] = tuple(value) if isinstance(f.default, tuple) and isinstance(value, list) else value
        return self.settings(**values)

    def check(self, raw: SuiteBlock) -> None:
        """Each key of a suite block known and of the kind its field takes (one line naming ``task.key``)."""
        unknown = sorted(set(raw) - set(self.keys()))
        if unknown:
            raise SuiteError(f"unknown {self.name} key '{unknown[0]}'; known: {', '.join(self.keys())}")
        for f in fields(self.settings):
            check = suite_meta(f).get("check")
            if f.name in raw and check is not None:
                check(f"{self.name}.{f.name}", raw[f.name])

    def uses_data(self, suite: Any) -> bool:
        """Whether a cell reads the suite's ``data`` (its identity is then part of the cell's key)."""
        return False

    # -- running ----------------------------------------------------------------------------------
    def prompts_per_cell(self, settings: S, length: int) -> int:
        """The forwards of ``length`` tokens one cell of one method runs: what ``--dry-run`` plans (a
        retrieval cell also generates its answer: :attr:`retrieval`)."""
        raise NotImplementedError(f"{self.name}: no plan of its prompts")

    def check_lengths(self, suite: Any, settings: S, tokenizer: Any) -> None:
        """Refuse, in one line, a length this task cannot build a prompt of with ``tokenizer`` (no
        weights; ``--dry-run`` runs it too, so a plan never calls a refused length fine)."""

    def prepare(self, suite: Any, settings: S, tokenizer: Any) -> Any:
        """What the task's cells read, loaded (and refused, in one line) before the weights load."""
        return None

    def run_cell(self, ctx: CellContext, settings: S, length: int) -> R:
        """One method at one length: an instance of ``result``."""
        raise NotImplementedError

    def partial(self, runner: Any, entry: MethodRow, length: int, settings: S, tokenizer: Any) -> dict | None:
        """The result so far of an unfinished cell, from its journal (None: nothing to show)."""
        return None

    # -- reading and reporting ---------------------------------------------------------------------
    def value(self, result: R, length: int) -> float | None:
        """The cell's number (``metric``) from its typed result (an instance of ``result``) at ``length``."""
        value = getattr(result, self.metric, None)
        return float(value) if isinstance(value, numbers.Real) else None

    def render(self, table: Any, labels: list[str], entries: dict[str, MethodRow]) -> list[str]:
        """The report's section of this task (``table``: a :class:`.aggregate.TaskTable`, whose ``results``
        hold each cell's typed result; ``entries``: label -> the suite's method entry)."""
        from ropescale.evals.tasks.report_cells import render_values

        return render_values(self, table, labels, entries)

    def plot(self, output: Path, table: Any, labels: list[str], context: PlotContext | None = None) -> list[str | None]:
        return []


__all__ = [
    "CellContext",
    "SuiteBlock",
    "MethodRow",
    "SuiteError",
    "SuiteMeta",
    "Task",
    "default_of",
    "flag_type",
    "setting",
    "suite_meta",
]
