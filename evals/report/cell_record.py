"""A suite's cell file (``OUTPUT/cells/*.json``) as one typed record: what ``ropescale eval suite``
writes and what its resume, its checks and its report read.

A cell file holds which method ran (its label, method, factor and parameters), the task and length,
the task's result (typed by the task's row of :mod:`.task_table`) and, as later writers added them,
the runtime that computed it, what it measured (model, data, protocol: :mod:`.cell_keys`) and the
scaling read back from the model. :meth:`SuiteCell.to_json` writes exactly what
:meth:`SuiteCell.from_json` read, so a record read and written again is the same file.

Every cell file written so far is version 1 of :data:`SCHEMA` and names no ``schema``; a file that
names one (a newer ropescale wrote it) is refused naming it, as is a key missing, unknown or of the
wrong type (one line naming the file and the key). Keys a reader may miss, in older files:
``runtime`` (before runtimes were recorded: counts as this machine's), ``measured`` (before cells
were keyed: recomputed when the suite has them, see :func:`.cell_keys.check_measured`) and
``scaling`` (before cells recorded the scaling they ran: :func:`.cell_keys.same_scaling`).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ropescale.errors import RopescaleError
from ropescale.evals.report.records import CellJSON, Fingerprint, MeasuredJSON, Params, ScalingJSON, Settings
from ropescale.evals.tasks.json_fields import only_known, take

#: the layout of a suite's cell file; version 1 (every cell written so far) names no ``schema``
SCHEMA = "ropescale.suite.cell/1"
CELL_REMEDY = "remove it and run the suite again to recompute that cell"

#: a JSON object as a cell file holds it, before it is read into the record (the file boundary)
JSON = dict[str, Any]


class CellFileError(RopescaleError):
    """A suite cell file this ropescale does not read; the message names the file and the key."""


class NewerCellError(CellFileError):
    """A cell file that names a ``schema``: a newer ropescale wrote it (the message names it)."""


#: cells of the layouts a command wrote before it ran through the suite runner: read by that command's
#: report (:mod:`.ruler_folder`, :mod:`.longppl_folder`), passed over by the suite's
EARLIER_LAYOUTS = ("ropescale.ruler.cell/1", "ropescale.longppl.cell/1")


class EarlierCellError(CellFileError):
    """A cell of an :data:`EARLIER_LAYOUTS` schema: not a suite cell, but read by its command's report."""


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _take(data: JSON, key: str, kinds: tuple[type, ...], what: str, where: str = "") -> Any:
    return take(data, key, kinds, what, where, error=CellFileError, show=_short)


def _optional(data: JSON, key: str, kinds: tuple[type, ...], what: str) -> Any:
    return _take(data, key, kinds, what) if key in data else None


def _known(data: JSON, known: tuple[str, ...], where: str = "") -> None:
    only_known(data, known, SCHEMA, where, error=CellFileError, show=_short)


@dataclass(frozen=True)
class Measured:
    """What a cell measured besides its method and runtime (:func:`.cell_keys.measured`): the model
    (name and content fingerprint), the data it read (None: the task reads none of the suite's) and the
    task's protocol (its settings but the lengths, plus the seed of a seeded task)."""

    model: Fingerprint
    data: Fingerprint | None
    protocol: Settings

    def to_json(self) -> MeasuredJSON:
        return {"model": self.model, "data": self.data, "protocol": self.protocol}

    @classmethod
    def from_json(cls, data: Any) -> Measured:
        if not isinstance(data, dict):
            raise CellFileError(f"measured = {_short(data)}: must be an object")
        _known(data, ("model", "data", "protocol"), "measured.")
        return cls(
            _take(data, "model", (dict,), "an object", "measured."),
            _take(data, "data", (dict, type(None)), "an object or null", "measured."),
            _take(data, "protocol", (dict,), "an object", "measured."),
        )


#: a cell file's keys, in the order they are described
_KEYS = (
    "method",
    "method_name",
    "factor",
    "params",
    "task",
    "length",
    "result",
    "runtime",
    "measured",
    "scaling",
    "load_avg",
)


@dataclass(frozen=True)
class SuiteCell:
    """One suite cell: the method's label (the file's ``method``) and what it ran (``method_name``,
    ``factor``, ``params``: the suite's entry), the task and length, the task's typed ``result`` (None
    for a task this ropescale has no row for), and where the file has them the ``runtime``, what it
    ``measured`` and the ``scaling`` read back from the model. ``path``: the file it was read from."""

    label: str
    method_name: str
    factor: float | None
    params: Params
    task: str
    length: int
    result: Any
    runtime: dict[str, str] | None = None
    measured: Measured | None = None
    scaling: ScalingJSON | None = None
    path: Path | None = None
    #: the result as the file holds it, written back as it was (a result class may add a default)
    result_json: JSON = field(default_factory=dict, repr=False, compare=False)
    #: the machine's 1-minute load average when the cell started and ended (a cell timed beside
    #: another job says so); None in files before it, and the file then lacks the key
    load_avg: list[float | None] | None = field(default=None, compare=False)

    @classmethod
    def of(
        cls,
        entry: Any,
        task: str,
        length: int,
        runtime: dict[str, str],
        result: Any,
        measured: MeasuredJSON | None = None,
        scaling: ScalingJSON | None = None,
        load_avg: list[float | None] | None = None,
    ) -> SuiteCell:
        """The record of a cell a suite ran (or is running): ``entry`` its method (a
        :class:`.spec.MethodEntry`), ``result`` the task's typed result or its JSON (an unfinished
        cell's, :func:`.in_progress.partial_cells`), ``measured`` :meth:`.folder.SuiteFolder.measured`
        and ``scaling`` what the model ran (:func:`ropescale.patching.readback.scaling_of`)."""
        raw = result if isinstance(result, dict) else result.to_json()
        return cls(
            entry.label,
            entry.method,
            entry.factor,
            entry.params,
            task,
            length,
            _typed(task, raw) if isinstance(result, dict) else result,
            runtime,
            None if measured is None else Measured.from_json(measured),
            scaling,
            None,
            raw,
            load_avg,
        )

    def to_json(self) -> CellJSON:
        """The JSON object of the cell's file, as the suite writes it (a key the record lacks is left out)."""
        return {
            **({"measured": self.measured.to_json()} if self.measured is not None else {}),
            "method": self.label,
            "method_name": self.method_name,
            "factor": self.factor,
            "params": self.params,
            **({"scaling": self.scaling} if self.scaling is not None else {}),
            "task": self.task,
            "length": self.length,
            **({"runtime": self.runtime} if self.runtime is not None else {}),
            **({"load_avg": self.load_avg} if self.load_avg is not None else {}),
            "result": self.result_json,
        }

    @classmethod
    def from_json(cls, data: Any, path: str | Path | None = None) -> SuiteCell:
        """The record of a cell file's JSON object.

        Raises:
            CellFileError: ``cell file 'P': factor = 'x4': must be a number or null; remove it and run the
                suite again to recompute that cell`` (a key missing, unknown or of the wrong type), or
                ``cell file 'P' has schema 'ropescale.suite.cell/2'; ...`` (a newer ropescale wrote it).
        """
        try:
            return cls._read(data, path)
        except EarlierCellError as exc:
            raise EarlierCellError(f"cell file '{path}' has {exc}") from None
        except NewerCellError as exc:
            raise NewerCellError(f"cell file '{path}' has {exc}") from None
        except CellFileError as exc:
            raise CellFileError(f"cell file '{path}': {exc}; {CELL_REMEDY}") from None

    @classmethod
    def _read(cls, data: Any, path: str | Path | None) -> SuiteCell:
        if not isinstance(data, dict):
            raise CellFileError(f"(the file) = {_short(data)}: must be an object")
        if data.get("schema") in EARLIER_LAYOUTS:
            raise EarlierCellError(f"schema {data['schema']!r}: a cell of the layout before the suite runner")
        if "schema" in data:
            raise NewerCellError(
                f"schema {_short(data['schema'])}; this ropescale reads suite cells of {SCHEMA}, which name "
                "no schema (written by a newer ropescale? upgrade it)"
            )
        _known(data, _KEYS)
        task = _take(data, "task", (str,), "a task name")
        raw = _take(data, "result", (dict,), "an object")
        runtime = _optional(data, "runtime", (dict,), "an object")
        if runtime is not None and not all(isinstance(v, str) for v in runtime.values()):
            raise CellFileError(f"runtime = {_short(runtime)}: must map names to strings")
        return cls(
            _take(data, "method", (str,), "a label"),
            _take(data, "method_name", (str,), "a method name"),
            _take(data, "factor", (numbers.Real, type(None)), "a number or null"),
            _take(data, "params", (dict,), "an object"),
            task,
            _take(data, "length", (int,), "a length in tokens"),
            _typed(task, raw),
            runtime,
            Measured.from_json(data["measured"]) if "measured" in data else None,
            _optional(data, "scaling", (dict,), "an object"),
            None if path is None else Path(path),
            raw,
            _optional(data, "load_avg", (list,), "a list of numbers"),
        )

    @classmethod
    def read(cls, path: str | Path) -> SuiteCell:
        """The record of the cell file at ``path``.

        Raises:
            CellFileError: see :meth:`from_json`; a file that is not JSON is a
                :class:`~ropescale.models.integrity.DamagedFileError` naming its position.
        """
        from ropescale.models.integrity import read_json_file

        return cls.from_json(read_json_file(path, "cell file", CELL_REMEDY), path)

    def runs(self, entry: Any) -> bool:
        """Whether the cell ran what ``entry`` (a :class:`.spec.MethodEntry`) asks: its method, factor
        and parameters."""
        return (self.method_name, self.factor, self.params) == (entry.method, entry.factor, entry.params)


def _typed(task: str, raw: JSON) -> Any:
    """The result of a ``task`` cell, typed by the task's row (None for a task without a row here)."""
    from ropescale.evals.tasks import task_table

    row = task_table.TABLE.get(task)
    if row is None:
        return None
    try:
        return row.result.from_json(raw)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        why = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__} {exc}"
        raise CellFileError(f"result = {_short(raw)}: not a {task} result ({why})") from None


def load_cells(output: str | Path) -> list[SuiteCell]:
    """Every cell file of a results folder (``OUTPUT/cells/*.json``), as records.

    Raises:
        CellFileError: a cell file this ropescale does not read (see :meth:`SuiteCell.from_json`).
        DamagedFileError: a file that is not JSON (a copy cut short), naming its position.
    """
    cells = []
    for path in sorted((Path(output) / "cells").glob("*.json")):
        try:
            cells.append(SuiteCell.read(path))
        except EarlierCellError:  # another command's report reads it (an eval ruler folder's own cells)
            continue
    return cells


__all__ = [
    "CELL_REMEDY",
    "EARLIER_LAYOUTS",
    "SCHEMA",
    "CellFileError",
    "EarlierCellError",
    "Measured",
    "NewerCellError",
    "SuiteCell",
    "load_cells",
]
