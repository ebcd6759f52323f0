"""The records a suite's report reads and writes, by name: what a cell measured and the scaling it ran
(``cells/*.json``; what it measured is :mod:`.run_folder`'s, shared with the RULER and LongPPL runners),
and ``results.json`` with its regression flags and retrieval statistics.

They are ``TypedDict``s, not dataclasses, for the reason of :mod:`ropescale.search.records`: each is the
JSON object a file holds, so its keys, their order and their values stay what earlier versions wrote
(``tests/test_goldens.py`` pins them byte for byte). A task's result (``cells/*.json``'s ``result``) is
its row's to name (:mod:`.task_table`); the cell keeps it as the file holds it.
"""

from __future__ import annotations

from typing import Any, TypedDict

from ropescale.evals.tasks.report_cells import StatisticsJSON
from ropescale.evals.tasks.run_folder import Fingerprint, MeasuredJSON, Settings, SettingValue
from ropescale.search.records import ParamValue

#: a method's own parameters as a suite entry and a cell record them
Params = dict[str, ParamValue]
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
