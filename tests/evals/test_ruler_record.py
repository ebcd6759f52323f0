"""A RULER cell file as one typed record (issue 40, point 1): every shipped cell file reads into a
:class:`CellRecord` and writes back byte for byte; a file of another schema, or with a key missing, unknown
or of the wrong type, is refused with its reason and skipped by ``read_cells``; a record written as
``RulerRun`` writes it counts as done for the run that wrote it and for no other."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from ropescale._io import atomic_write_json
from ropescale.evals.advice.battery_evidence import BATTERY_DIR
from ropescale.evals.tasks.ruler.cell import RulerCell, RulerRecord
from ropescale.evals.tasks.ruler.earlier import EarlierCells
from ropescale.evals.tasks.ruler.record import SCHEMA, CellFileError, CellRecord, Scaling, read_cells
from ropescale.evals.tasks.ruler.tasks import TASKS

ALL_SHIPPED = sorted(BATTERY_DIR.glob("*/*.json"))
#: the one-file-per-task layout (``schema`` named in the file); the rest are the suite runner's cells
SHIPPED = [p for p in ALL_SHIPPED if "schema" in json.loads(p.read_text())]
SUITE_SHIPPED = [p for p in ALL_SHIPPED if p not in SHIPPED]


def test_there_are_shipped_cells_to_check():
    assert len(SHIPPED) >= 3


@pytest.mark.parametrize("path", SUITE_SHIPPED, ids=[p.name for p in SUITE_SHIPPED])
def test_every_shipped_suite_cell_round_trips_and_reads_as_the_battery_does(path, tmp_path):
    """A shipped folder may hold cells of ``ropescale eval ruler``'s suite layout (every task of a length in
    one file): each writes back byte for byte and reads into complete records of the embedded model."""
    from ropescale.evals.report.cell_record import SuiteCell
    from ropescale.evals.report.ruler_folder import read_ruler_cells

    data = json.loads(path.read_text())
    cell = SuiteCell.from_json(data, path)
    assert cell.to_json() == data
    atomic_write_json(tmp_path / "again.json", cell.to_json())  # as the suite runner writes a cell
    assert (tmp_path / "again.json").read_bytes() == path.read_bytes()
    records, skipped = read_ruler_cells([path])
    assert skipped == [] and records and all(r.complete and r.model == "smollm2-135m" for r in records)
    assert {r.task for r in records} == set(data["result"]["tasks"])


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_every_shipped_cell_file_round_trips_byte_for_byte(path, tmp_path):
    data = json.loads(path.read_text())
    record = CellRecord.from_json(data, path)
    assert record.to_json() == data
    atomic_write_json(tmp_path / "again.json", record.to_json())  # as RulerRun writes a cell
    assert (tmp_path / "again.json").read_bytes() == path.read_bytes()
    assert (record.model, record.task, record.length) == ("smollm2-135m", data["cell"]["task"], data["cell"]["length"])
    assert record.score == data["cell"]["score"] and record.path == path and record.complete


def _run(tmp_path: Path, seed: int = 0) -> EarlierCells:
    return EarlierCells("smollm2-135m", Scaling("yarn", 4.0), [TASKS["niah_single_1"]], [1024], 2, tmp_path, seed=seed)


def _record(run: EarlierCells) -> CellRecord:
    cell = RulerCell("niah_single_1", 1024, 2, 0, 128, "niah_single_1", "repeat")
    cell.records = [RulerRecord(i, 900, ["1234567"], " 1234567.", 1.0) for i in range(2)]
    scaling = {"method": "yarn", "params": {"factor": 4.0}}
    rope = {"rope_type": "yarn", "factor": 4.0}
    runtime = {"attention": "sdpa"}
    return CellRecord(
        run.fingerprint("niah_single_1", 1024), "yarn-x4", False, scaling, rope, "0.4.13", runtime, 1024, cell
    )


def test_a_record_written_as_the_run_writes_it_reads_back_and_counts_as_done(tmp_path):
    run = _run(tmp_path)
    record = _record(run)
    path = run.path("niah_single_1", 1024)
    atomic_write_json(path, record.to_json())
    (back,), skipped = read_cells([path])
    assert skipped == [] and back == replace(record, path=path) and back.to_json() == record.to_json()
    assert run.is_done("niah_single_1", 1024)
    assert not _run(tmp_path, seed=1).is_done("niah_single_1", 1024)  # another fingerprint: not done


def _broken(data: dict, how: str) -> dict:
    data = json.loads(json.dumps(data))
    if how == "newer":
        data["schema"] = "ropescale.ruler.cell/2"
    elif how == "other":
        data["schema"] = "ropescale.results/1"
    elif how == "no label":
        del data["label"]
    elif how == "unscaled a string":
        data["unscaled"] = "yes"
    elif how == "length a bool":
        data["fingerprint"]["length"] = True
    elif how == "unknown key":
        data["extra"] = 1
    elif how == "no records":
        del data["cell"]["records"]
    return data


@pytest.mark.parametrize(
    "how, why",
    [
        ("newer", "schema 'ropescale.ruler.cell/2', this ropescale reads ropescale.ruler.cell/1 (a newer one?)"),
        ("other", "schema 'ropescale.results/1', this ropescale reads ropescale.ruler.cell/1 (not a RULER cell file)"),
        ("no label", "label = (missing)"),
        ("unscaled a string", "unscaled = 'yes': must be true or false"),
        ("length a bool", "fingerprint.length = True: must be an integer"),
        ("unknown key", f"extra = 1: not a key of {SCHEMA}"),
        ("no records", f"a {SCHEMA} file without a complete cell ('records')"),
    ],
)
def test_a_file_that_is_not_this_layout_is_refused_and_skipped_with_its_reason(tmp_path, how, why):
    run = _run(tmp_path)
    good = run.path("niah_single_1", 1024)
    atomic_write_json(good, _record(run).to_json())
    bad = tmp_path / "cells" / "bad.json"
    bad.write_text(json.dumps(_broken(_record(run).to_json(), how)))
    with pytest.raises(CellFileError) as err:
        CellRecord.from_json(json.loads(bad.read_text()))
    assert str(err.value) == why
    records, skipped = read_cells([bad, good])
    assert [r.path for r in records] == [good] and skipped == [f"{bad}: {why}"]
