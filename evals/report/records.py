"""The records a suite's report reads and writes, by name: what a cell measured and the scaling it ran
(``cells/*.json``), and ``results.json`` with its regression flags and retrieval statistics.

They are ``TypedDict``s, not dataclasses, for the reason of :mod:`ropescale.search.records`: each is the
JSON object a file holds, so its keys, their order and their values stay what earlier versions wrote
(``tests/test_goldens.py`` pins them byte for byte). A task's result (``cells/*.json``'s ``result``) is
its row's to name (:mod:`.task_table`); the cell keeps it as the file holds it.
"""

from __future__ import annotations

from typing import Any, TypedDict

from ropescale.search.records import ParamValue

#: a method's own parameters as a suite entry and a cell record them
Params = dict[str, ParamValue]
#: a value of a task's settings as a suite file writes it (a number, a name, a list of lengths or depths)
SettingValue = float | int | str | bool | list[int] | list[float] | list[str] | None
#: a task's settings by name (its row's fields: each task has its own), as the suite file and a cell's
#: ``protocol`` hold them
Settings = dict[str, SettingValue]


class Fingerprint(TypedDict, total=False):
    """A model's or data's name as given and its content fingerprint (:mod:`ropescale.models.identity`);
    a corpus or hub data names no fingerprint, no data names null."""

    name: str | None
    fingerprint: str


class MeasuredJSON(TypedDict):
    """A cell's ``measured`` key (:func:`.cell_keys.measured`)."""

    model: Fingerprint
    data: Fingerprint | None
    protocol: Settings


#: the scaling a model ran, read back from it (:func:`ropescale.patching.readback.scaling_of`), with
#: ``as``: ``saved``, ``replaced``, ``composed`` ...; a cell's ``scaling``, ``results.json``'s ``methods``
ScalingJSON = TypedDict(
    "ScalingJSON",
    {"method": str, "factor": float | None, "params": Params, "attention_factor": float, "as": str},
    total=False,
)


class CellJSON(TypedDict, total=False):
    """A suite's cell file, in the order :meth:`.cell_record.SuiteCell.to_json` writes it (``measured``,
    ``scaling``, ``runtime`` and ``load_avg`` only where the record has them)."""

    measured: MeasuredJSON
    method: str
    method_name: str
    factor: float | None
    params: Params
    scaling: ScalingJSON
    task: str
    length: int
    runtime: dict[str, str]
    load_avg: list[float | None]
    #: the task's result as the file holds it: its keys are the task row's (:mod:`.task_table`)
    result: dict[str, Any]


class StatisticsJSON(TypedDict):
    """A retrieval cell's statistics (``results.json``'s ``statistics``)."""

    accuracy: float
    trials: int
    successes: float
    wilson95: list[float]


class RegressionFlag(TypedDict, total=False):
    """A short-context regression (``results.json``'s ``regressions``); retrieval flags add the
    difference's ``interval``."""

    method: str
    task: str
    length: int
    value: float
    baseline: float
    interval: list[float]


class ResultsJSON(TypedDict, total=False):
    """``results.json``, in the order :func:`.aggregate.write_report` writes it; ``report`` and
    ``markdown`` are returned to the caller, not written."""

    schema: str
    suite: str
    model: str
    dtype: str
    runtimes: list[dict[str, str]]
    methods: dict[str, ScalingJSON]
    carries: str
    sized: str
    #: task -> label -> length -> the cell's result as its file holds it (the task row's keys)
    tasks: dict[str, dict[str, dict[str, dict[str, Any]]]]
    passkey_jitter: float
    statistics: dict[str, dict[str, dict[str, StatisticsJSON]]]
    regressions: list[RegressionFlag]
    plots: list[str]
    cells_finished: int
    cells_total: int
    report: str
    markdown: str


__all__ = [
    "CellJSON",
    "Fingerprint",
    "MeasuredJSON",
    "Params",
    "RegressionFlag",
    "ResultsJSON",
    "ScalingJSON",
    "SettingValue",
    "Settings",
    "StatisticsJSON",
]
