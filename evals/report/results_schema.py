"""The version of ropescale's result files: ``results.json`` of a suite and the evidence files
(``evals/measured/*.json``) read by ``recommend`` and the frontier.

A file carries ``"schema": "ropescale.results/N"``. A file without it is version 1 (every file
written before the field existed: ``results.json`` and the shipped evidence alike) and reads as it
always did; version 2 adds the field and the task table's tasks (RULER) to ``results.json``. A file
naming a version this ropescale does not know (a newer one wrote it, or it is not a results file) is
refused in one line naming the file and the version, rather than read as if it were the old shape.

:class:`ResultsSummary` is a ``results.json`` read back, typed: what each label ran, each task's
results typed by the task's row of :mod:`.task_table`, and the suite's header (what ``recommend`` and
the frontier read, :func:`.evidence.read_results`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ropescale.errors import RopescaleError
from ropescale.evals.report.records import Params, ResultsJSON, ScalingJSON

NAME = "ropescale.results"
#: the version this ropescale writes
VERSION = 2
#: the versions it reads
READS = (1, 2)


def stamp() -> dict[str, str]:
    """The ``schema`` field of a file written now."""
    return {"schema": f"{NAME}/{VERSION}"}


def version(data: Any, path: str | Path, what: str = "results file") -> int:
    """The schema version of a loaded result file (1 where it names none).

    Raises:
        RopescaleError: ``results file 'P' has schema 'ropescale.results/9'; this ropescale reads
            ropescale.results/1 to /2 (written by a newer ropescale? upgrade it)``.
    """
    if not isinstance(data, dict) or "schema" not in data:
        return 1
    named = data["schema"]
    found = re.fullmatch(rf"{re.escape(NAME)}/(\d+)", named) if isinstance(named, str) else None
    if found is None or int(found.group(1)) not in READS:
        raise RopescaleError(
            f"{what} '{path}' has schema {named!r}; this ropescale reads {NAME}/{READS[0]} to /{READS[-1]} "
            "(written by a newer ropescale? upgrade it)"
        )
    return int(found.group(1))


def check_suite_results(output: str | Path) -> None:
    """Stop before a suite writes its report where ``OUTPUT/results.json`` is not a suite's this
    ropescale writes: one of a newer version (:data:`READS`) or of another task (an
    ``eval ruler`` or ``eval longppl`` folder). A file that is not JSON is left to the report to replace.

    Raises:
        RopescaleError: ``results file 'o/results.json' has schema 'ropescale.results/9'; this ropescale
            writes ropescale.results/2 (...)``, or ``results folder 'o' holds another task's results.json
            (schema 'ropescale.ruler.results/1'); ropescale eval's suite runner writes its own there: ...``.
    """
    from ropescale.evals.tasks.run_folder import refuse_other, schema_of

    output = Path(output)
    results = output / "results.json"
    if not results.is_file():
        return
    readable, named = schema_of(results)
    ours = f"{NAME}/{VERSION}"
    if not readable or named is None:
        return  # version 1 (no schema), or damaged: the report replaces it
    known = {f"{NAME}/{v}" for v in READS}
    if named not in known:
        refuse_other(results, named, ours, "ropescale eval's suite runner", output)


@dataclass(frozen=True)
class Ran:
    """What a label ran: a method (as the user named it), its factor and parameters."""

    method: str
    factor: float | None = None
    params: Params = field(default_factory=dict)

    @classmethod
    def of(cls, entry: ScalingJSON) -> Ran:
        """A label's entry of ``results.json``'s ``methods`` (or of the ``suite.yaml`` beside an older one)."""
        factor = entry.get("factor")
        return cls(str(entry.get("method")), None if factor is None else float(factor), dict(entry.get("params") or {}))


@dataclass(frozen=True)
class ResultsSummary:
    """A ``results.json`` read back: its version, the suite's name, model and dtype as written (None where
    absent), what each label ran (``methods``; from the ``suite.yaml`` beside a file written before it
    recorded them; None where neither says), every label in the order the tasks name them, each task's
    results (task -> label -> length -> the row's typed result; a result the row cannot read is left
    out), the passkey placement and the count of finished cells, where recorded."""

    path: Path
    version: int
    model: str | None
    suite: str | None
    dtype: str | None
    methods: dict[str, Ran] | None
    labels: tuple[str, ...]
    tasks: dict[str, dict[str, dict[int, Any]]]
    passkey_jitter: float | None = None
    cells_finished: int | None = None
    cells_total: int | None = None

    def results(self, task: str, label: str) -> dict[int, Any]:
        """``label``'s typed results of ``task`` by length (empty where it has none)."""
        return self.tasks.get(task, {}).get(label, {})

    @classmethod
    def from_json(cls, data: Any, path: str | Path) -> ResultsSummary:
        """The summary of a loaded ``results.json``.

        Raises:
            RopescaleError: a newer schema (:func:`version`), or not a results file (no ``tasks`` object).
        """
        found = version(data, path)
        if not isinstance(data, dict) or not isinstance(data.get("tasks"), dict):
            raise RopescaleError(
                f"results file '{path}' is not a results.json written by ropescale eval (it has no 'tasks' object)"
            )
        path = Path(path)
        tasks = data["tasks"]
        jitter = data.get("passkey_jitter")
        text = lambda key: str(data[key]) if key in data else None  # noqa: E731
        return cls(
            path,
            found,
            text("model"),
            text("suite"),
            text("dtype"),
            _methods(data, path),
            tuple(dict.fromkeys(lb for t in tasks.values() if isinstance(t, dict) for lb in t)),
            {name: _typed(name, t) for name, t in tasks.items() if isinstance(t, dict)},
            float(jitter) if isinstance(jitter, int | float) else None,
            data.get("cells_finished"),
            data.get("cells_total"),
        )


def _methods(data: ResultsJSON, path: Path) -> dict[str, Ran] | None:
    """What each label ran, as the runner recorded it, else as the ``suite.yaml`` beside the file says."""
    if isinstance(data.get("methods"), dict):
        return {str(k): Ran.of(v) for k, v in data["methods"].items() if isinstance(v, dict) and v.get("method")}
    suite_file = path.with_name("suite.yaml")
    if not suite_file.is_file():
        return None
    import yaml

    try:
        suite = yaml.safe_load(suite_file.read_text()) or {}
        return {
            str(m.get("label") or m["method"]): Ran.of(m) for m in suite.get("methods") or [] if isinstance(m, dict)
        }
    except (OSError, yaml.YAMLError, KeyError):
        return None


def _typed(task: str, table: dict[str, Any]) -> dict[str, dict[int, Any]]:
    """A task's results (label -> length -> JSON) typed by its row; a result it cannot read is left out.
    A retrieval result that does not say its depths or trials counts none (no interval is made up)."""
    from ropescale.evals.tasks import task_table

    row = task_table.TABLE.get(task)
    if row is None:
        return {}
    out: dict[str, dict[int, Any]] = {}
    for label, by_length in table.items():
        if not isinstance(by_length, dict):
            continue
        out[str(label)] = {}
        for n, raw in by_length.items():
            if not str(n).isdigit() or not isinstance(raw, dict):
                continue
            try:
                out[str(label)][int(n)] = row.result.from_json(
                    {"depths": [], "trials": 0, **raw} if row.retrieval else raw
                )
            except (KeyError, TypeError, ValueError, AttributeError):
                continue
    return out


__all__ = ["NAME", "READS", "VERSION", "Ran", "ResultsSummary", "check_suite_results", "stamp", "version"]
