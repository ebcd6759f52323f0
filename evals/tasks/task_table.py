"""The table of evaluation tasks: each task kind declared once, one row each.

    TABLE = {perplexity, passkey, needle, ruler, longppl}

A row (:class:`.task_base.Task`, in its own file) carries the task's settings dataclass — whose fields
are both a suite file's keys and the flags of ``ropescale eval <task>`` — how it runs one cell, its
typed result, its metric and direction, and its report section. The suite runner, its checks, its
cell keys, its relative lengths, the report and the command line look a task up here instead of
naming it, so adding a task is one row here and one file (docs/evaluation.md, "Adding a task").
"""

from __future__ import annotations

import argparse
from dataclasses import MISSING, fields
from typing import Any, Literal, TypeVar, overload

from ropescale.evals.tasks.task_base import SuiteBlock, SuiteError, Task, default_of, suite_meta
from ropescale.evals.tasks.task_longppl import LONGPPL, LongPPL
from ropescale.evals.tasks.task_perplexity import PERPLEXITY, Perplexity
from ropescale.evals.tasks.task_retrieval import NEEDLE, PASSKEY, Needle, Passkey
from ropescale.evals.tasks.task_ruler import RULER, Ruler

#: any row, whatever its settings and result (``Task[S, R]``)
AnyTask = Task[Any, Any]
#: a row of a precise type (``Perplexity``, a test's row): :func:`register` gives it back as it came
T = TypeVar("T", bound=AnyTask)

#: every task kind a suite may run, in the order a suite's report lists them
TABLE: dict[str, AnyTask] = {t.name: t for t in (PERPLEXITY, PASSKEY, NEEDLE, RULER, LONGPPL)}


def register(task: T) -> T:
    """Add a row (a task of a plug-in, or of a test); returns it, typed as it came. A name already taken is refused."""
    if task.name in TABLE and TABLE[task.name] is not task:
        raise ValueError(f"task '{task.name}' is already in the table")
    TABLE[task.name] = task
    return task


def unregister(name: str) -> None:
    TABLE.pop(name, None)


def names() -> tuple[str, ...]:
    return tuple(TABLE)


# a built-in row looked up by its literal name is its own class to a type checker, so that
# ``get("ruler").run_cell(...)`` is a RulerBattery; any other name is some row
@overload
def get(name: Literal["perplexity"]) -> Perplexity: ...
@overload
def get(name: Literal["passkey"]) -> Passkey: ...
@overload
def get(name: Literal["needle"]) -> Needle: ...
@overload
def get(name: Literal["ruler"]) -> Ruler: ...
@overload
def get(name: Literal["longppl"]) -> LongPPL: ...
@overload
def get(name: str) -> AnyTask: ...
def get(name: str) -> AnyTask:
    try:
        return TABLE[name]
    except KeyError:
        raise SuiteError(f"unknown task '{name}'; known: {', '.join(TABLE)}") from None


# -- a cell's protocol: what it measured besides the model and the data ---------------------------------
def protocol(task: AnyTask, raw: SuiteBlock, seed: int) -> SuiteBlock:
    """The ``protocol`` of a cell's ``measured`` key: the task's settings as the suite wrote them
    (not the lengths), a default that differs from what an absent key meant before it was set
    (``legacy``), and the seed of a seeded task."""
    out = {k: v for k, v in raw.items() if k != "lengths"}
    for f in fields(task.settings):
        meta = suite_meta(f)
        legacy = meta.get("legacy", MISSING)
        if legacy is MISSING:
            continue
        if f.name not in out and default_of(f) != legacy:
            out[f.name] = default_of(f)
        if meta.get("omit") and f.name in out and out[f.name] == legacy:
            del out[f.name]  # as cells of the old default never recorded it
    if task.seeded:
        out["seed"] = seed
    return {"task": task.name, **out}


def canonical(measured: Any, task_name: str) -> Any:
    """A ``measured`` key of a ``task_name`` cell with every setting that has a ``legacy`` meaning written
    out, so that a cell written before the default moved (key absent) and one naming the same value
    compare equal."""
    if not isinstance(measured, dict) or not isinstance(measured.get("protocol"), dict):
        return measured
    task = TABLE.get(task_name)
    if task is None:
        return measured
    proto = dict(measured["protocol"])
    for f in fields(task.settings):
        legacy = suite_meta(f).get("legacy", MISSING)
        if legacy is not MISSING and f.name not in proto:
            proto[f.name] = legacy
    return {**measured, "protocol": proto}


def same_measured(a: Any, b: Any, task_name: str) -> bool:
    """Whether two ``measured`` keys of a ``task_name`` cell are one measurement: :func:`canonical`, the
    model and data by content where both record it (:func:`.run_folder.by_content`)."""
    from ropescale.evals.tasks.run_folder import by_content

    return by_content(canonical(a, task_name)) == by_content(canonical(b, task_name))


# -- the command line ----------------------------------------------------------------------------------
def add_flags(parser: argparse.ArgumentParser, task: AnyTask) -> None:
    """The flags of ``ropescale eval <task>`` from the task's settings fields (:func:`ropescale.options.add_arguments`)."""
    from ropescale.options import add_arguments

    add_arguments(parser, task.settings)


def settings_from_args(task: AnyTask, args: argparse.Namespace) -> SuiteBlock:
    """The suite block of ``ropescale eval <task>``'s flags: every setting, as a suite file writes it
    (a cell's protocol leaves out what cells never recorded, :func:`protocol`)."""
    from ropescale.options import from_arguments

    settings = from_arguments(task.settings, args)
    block: SuiteBlock = {"lengths": list(args.lengths)}
    for f in fields(task.settings):
        value = getattr(settings, f.name)
        value = list(value) if isinstance(value, tuple) else value
        check = suite_meta(f).get("check")
        if check is not None:
            try:
                check(f"--{f.name.replace('_', '-')}", value)
            except SuiteError as exc:
                raise ValueError(str(exc)) from None
        block[f.name] = value
    return block


__all__ = ["TABLE", "AnyTask", "add_flags", "canonical", "get", "names", "protocol", "register", "same_measured"]
