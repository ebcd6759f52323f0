"""What a suite's cell is and what it measured: a cell's file name and record, and the key that
ties its numbers to the model, data and protocol that produced them.

A cell's record names its method and runtime (a different one is recomputed, see
:meth:`.folder.SuiteFolder.is_done`) and, under ``measured``, the model's content fingerprint
(:func:`ropescale.models.identity.model_identity`), the data it read and the task's protocol
(mode, stride, token budget, depths, trials, seed...). A results folder whose cells measured
something else stops the run with the first difference named (:func:`check_measured`): the report
would otherwise show one model's numbers under another's name. The model and data are compared by
content where recorded, so the same folder under another path is the same model
(:func:`.run_folder.by_content`). What a file of evidence takes from
its suites' cells, the one runtime and the one passkey placement they share, is read here too
(:func:`cells_runtime`, :func:`cells_jitter`).
"""

from __future__ import annotations

import functools
import json
import operator
import re
from pathlib import Path
from typing import Any

from ropescale.errors import RopescaleError
from ropescale.evals.report.cell_record import CELL_REMEDY, EarlierCellError, NewerCellError, SuiteCell
from ropescale.evals.report.records import Fingerprint, MeasuredJSON, ScalingJSON
from ropescale.evals.tasks.run_folder import difference
from ropescale.evals.tasks.task_base import SuiteError
from ropescale.models.integrity import read_json_file
from ropescale.models.runtime import runtime_text, same_runtime


@functools.lru_cache(maxsize=64)
def _scaling_run(model: str, method: str, factor: float | None, params: str) -> ScalingJSON | None:
    from ropescale.models.loading import load_config
    from ropescale.patching.plan import plan_scaling
    from ropescale.scaling import Scaling

    try:
        config = load_config(model)
    except (RopescaleError, OSError, ValueError):  # a report of a folder copied without its model
        return None
    params = json.loads(params)
    plan = plan_scaling(config, Scaling.evaluated(method, factor, params))
    return json.loads(json.dumps({"method": plan.method.name, "params": plan.method.params()}))


@functools.lru_cache(maxsize=64)
def _saved_run(model: str, stamp: int) -> ScalingJSON | None:
    from ropescale.models.loading import load_config
    from ropescale.patching.readback import scaling_of

    try:
        config = load_config(model)
    except (RopescaleError, OSError, ValueError):
        return None
    return {k: v for k, v in scaling_of(config).items() if k in ("method", "params")}


def scaling_run(model: str, entry: Any) -> ScalingJSON | None:
    """The scaling a cell of ``entry`` runs on ``model``: the method and every parameter patching
    resolves, a saved checkpoint's own where the entry names none (``patching.plan._as_saved``);
    None where the model's config cannot be read."""
    from ropescale.evals.tasks.saved import is_saved

    if is_saved(entry.method):
        config = Path(str(model)) / "config.json"  # a folder patched again in this process reads anew
        return _saved_run(str(model), config.stat().st_mtime_ns if config.is_file() else 0)
    return _scaling_run(str(model), entry.method, entry.factor, json.dumps(entry.params, sort_keys=True))


def same_scaling(cell: SuiteCell, ours: ScalingJSON | None, entry: Any) -> bool:
    """Whether a cell ran the scaling a cell of ``entry`` runs now (``ours``: :func:`scaling_run`). A cell
    written before cells recorded it ran the method's defaults with the entry's parameters (a saved
    checkpoint's own parameters were not kept then): it counts only where those are what runs now."""
    if ours is None:
        return True
    if cell.scaling is not None:  # a cell records more (factor, attention factor, as)
        return {k: cell.scaling.get(k) for k in ("method", "params")} == ours
    from ropescale.methods import get_method

    params = {k: v for k, v in entry.params.items() if k not in ("kv_consistent", "compose")}
    method = get_method(entry.method, **params, **({"factor": entry.factor} if entry.factor is not None else {}))
    return json.loads(json.dumps({"method": method.name, "params": method.params()})) == ours


def cell_id(entry: Any, task: str, length: int) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", f"{entry.label}__{task}__{length}")


def measured(suite: Any, identity: dict[str, Fingerprint], task: str) -> MeasuredJSON:
    """The ``measured`` key of a cell of ``task``: the model (``identity["model"]``), the data it
    reads (where its row says it reads the suite's data: perplexity, needle with a haystack;
    ``identity["data"]``) and the task's protocol (:func:`.task_table.protocol`: its settings but the
    lengths, plus the seed of a seeded task)."""
    from ropescale.evals.tasks import task_table

    row = task_table.get(task)
    return {
        "model": identity["model"],
        "data": identity["data"] if row.uses_data(suite) else None,
        "protocol": task_table.protocol(row, suite.blocks.get(task) or {}, suite.seed),
    }


def check_measured(runner: Any) -> None:
    """Stop, naming the first difference, when the results folder holds cells measured on another
    model, data or protocol (the report reads every cell there). Cells written before cells recorded
    this are recomputed when the suite has them, and stop the run otherwise.

    Raises:
        SuiteError: ``results folder 'D' holds C.json, measured with another model.fingerprint: 'a…' -> 'b…'; ...``
        CellFileError: a cell file the suite does not run (the report would read it) is damaged; any
            cell file names a ``schema`` (a newer ropescale wrote it: recomputing would overwrite it).
    """
    from ropescale.evals.tasks import task_table

    if not runner.cells_dir.is_dir():
        return
    ours = {runner.cell_path(*cell) for cell in runner.suite.cells()}
    front = getattr(runner, "front", None)
    for path in sorted(runner.cells_dir.glob("*.json")):
        if front is not None and front.own_cells_only and path not in ours:
            continue  # another run's row (eval ruler's): its report tells them apart; the front checks the model
        try:
            cell = SuiteCell.read(path)
        except EarlierCellError:
            continue  # an earlier layout's cell: its command's report reads it (and keys it, .ruler_folder)
        except NewerCellError:
            raise  # recomputing it would overwrite what a newer ropescale measured
        except RopescaleError:  # damaged, or not a cell file
            if path in ours:
                continue  # recomputed (is_done)
            raise  # the report would read it: named now, before anything is written
        if cell.task not in task_table.TABLE:
            continue
        if cell.measured is None:
            if path in ours:
                continue
            raise SuiteError(
                f"results folder '{runner.output}' holds {path.name}, written without a record of its model and "
                "data; give another --output, or remove that cell"
            )
        task, recorded = cell.task, cell.measured.to_json()
        ours_now = json.loads(json.dumps(runner.measured(task)))  # as it reads back
        if not task_table.same_measured(recorded, ours_now, task):
            old, new = task_table.canonical(recorded, task), task_table.canonical(ours_now, task)
            raise SuiteError(
                f"results folder '{runner.output}' holds {path.name}, measured with a different "
                f"{difference(old, new)}; give another --output, or remove the folder "
                "to measure again"
            )


def check_protocols(runner: Any) -> None:
    """Stop ``--report-only`` when a cell of the folder was measured on another protocol than the suite
    asks (a folder written by a run sized with ``--samples``, reported without it): its numbers would
    stand in the report as the suite's. Unlike :func:`check_measured` the model and data are not
    compared, so that a folder copied without its model still reports.

    Raises:
        SuiteError: ``results folder 'D' holds C.json, measured with a different protocol.trials: 1 -> 3; ...``
    """
    from ropescale.evals.tasks import task_table

    if not runner.cells_dir.is_dir():
        return
    for path in sorted(runner.cells_dir.glob("*.json")):
        try:
            cell = SuiteCell.read(path)
        except RopescaleError:
            continue  # named by the report itself (load_cells)
        if cell.task not in runner.suite.tasks() or cell.measured is None:
            continue
        old = task_table.canonical(cell.measured.to_json(), cell.task).get("protocol")
        new = task_table.canonical(json.loads(json.dumps(runner.measured(cell.task))), cell.task).get("protocol")
        if old != new:
            from ropescale.training.checkpoints import first_difference

            raise SuiteError(
                f"results folder '{runner.output}' holds {path.name}, measured with a different "
                f"{first_difference(old, new, 'protocol.')}; report it with the --lengths/--samples of the run that "
                "wrote it (its suite.yaml says them under 'sized'), or give another --output"
            )


def cells_runtime(folders: list[Path]) -> dict[str, str] | None:
    """The one runtime (device, dtype, attention, bf16 kernels) the cells of these suite folders were
    computed with (``<folder>/cells/*.json``); None where no cell records one. Cells written before
    ``kernels`` was recorded count as matching, as a suite's resume counts them.

    Raises:
        RopescaleError: the cells were computed on different runtimes (the message names two).
    """
    runtimes = [
        runtime
        for folder in folders
        for f in sorted(Path(folder).glob("cells/*.json"))
        if isinstance(runtime := read_json_file(f, "cell file", CELL_REMEDY).get("runtime"), dict) and runtime
    ]
    if not runtimes:
        return None
    distinct = list({tuple(sorted(r.items())): r for r in runtimes}.values())
    for i, a in enumerate(distinct):
        for b in distinct[i + 1 :]:
            if not same_runtime(a, b):
                raise RopescaleError(
                    f"cells computed on {runtime_text(a)} and on {runtime_text(b)}: one file, one machine kind"
                )
    return functools.reduce(operator.or_, distinct)  # the kernels of the cells that record them


def cells_jitter(folders: list[Path]) -> float:
    """The passkey placement the passkey cells of these suite folders share: 0 for fixed depths,
    else the ``jitter`` of their protocol (``evals/tasks/passkey.py``).

    Raises:
        RopescaleError: cells of both placements, or of two jitters (the message names two).
    """
    found = {
        float(
            ((read_json_file(f, "cell file", CELL_REMEDY).get("measured") or {}).get("protocol") or {}).get(
                "jitter", 0.0
            )
        )
        for folder in folders
        for f in sorted(Path(folder).glob("cells/*__passkey__*.json"))
    }
    if len(found) > 1:
        a, b = sorted(found)[:2]
        raise RopescaleError(
            f"passkey cells placed with jitter {a:g} and {b:g}: one file, one placement (0 = fixed depths)"
        )
    return found.pop() if found else 0.0
