"""A suite's cell file as one typed record (evals/report/cell_record.py): every cell main's suite wrote reads
and writes back byte for byte, older layouts load with their defaults, and a damaged or newer file is
refused in one line naming the file and the key (or the version).

``tests/data/suite_cells/cells/`` was written by ``ropescale eval suite`` (commit 67e1bd4, before the
record existed) on the tiny Llama of ``tests/evals/conftest.py``: perplexity, passkey, needle and
LongPPL cells of ``none``, ``yarn`` x4 and ``linear`` x4 (paths renamed ``tiny-llama`` and ``text.txt``).
Four ``linear`` cells were cut to what earlier writers wrote: no ``runtime``, ``measured`` nor
``scaling`` (2737d10: ``linear__passkey__128``, ``linear__perplexity__64``), no ``measured`` nor
``scaling`` (5b5deca: ``linear__perplexity__200``), no ``scaling`` (722f1d1: ``linear__passkey__300``);
``saved__perplexity__64`` is a ``saved`` row's cell (the scaling read back from a YaRN checkpoint).
``ruler/none__ruler__1024.json``: a RULER battery cell (niah_single_1 and fwe, one sample each) of
``test_ruler_cli.py``'s tiny model, written by this record's writer (the others pin it to main's bytes).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from ropescale.errors import RopescaleError
from ropescale.evals.report.cell_record import CELL_REMEDY, SCHEMA, CellFileError, NewerCellError, SuiteCell, load_cells
from ropescale.evals.suite.spec import MethodEntry

DATA = Path(__file__).resolve().parents[1] / "data" / "suite_cells"
CELLS = sorted((DATA / "cells").glob("*.json")) + sorted((DATA / "ruler").glob("*.json"))


def dump(obj) -> str:
    """As the suite writes a cell (``ropescale._io.atomic_write_json``)."""
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


@pytest.mark.parametrize("path", CELLS, ids=[p.stem for p in CELLS])
def test_every_cell_reads_and_writes_back_byte_for_byte(path):
    cell = SuiteCell.read(path)
    assert dump(cell.to_json()) == path.read_text(encoding="utf-8")
    kind = {
        "perplexity": "PerplexityCell",
        "passkey": "RetrievalCell",
        "needle": "RetrievalCell",
        "ruler": "RulerBattery",
    }
    assert type(cell.result).__name__ == kind.get(cell.task, "LongPPLCell")
    # the writer's own path: the record of the entry and the typed result, as the suite builds it now
    entry = MethodEntry(cell.label, cell.method_name, cell.factor, cell.params)
    measured = None if cell.measured is None else cell.measured.to_json()
    built = SuiteCell.of(entry, cell.task, cell.length, cell.runtime, cell.result, measured, cell.scaling)
    assert dump(built.to_json()) == path.read_text(encoding="utf-8") and built == replace(cell, path=None)


def test_older_layouts_load_with_what_their_keys_meant():
    cells = {c.path.stem: c for c in load_cells(DATA)}
    assert len(cells) == 19
    oldest = cells["linear__passkey__128"]
    assert (oldest.runtime, oldest.measured, oldest.scaling) == (None, None, None)
    assert oldest.result.depths == [0.0, 1.0] and oldest.result.trials == 2
    assert cells["linear__perplexity__200"].runtime == cells["none__perplexity__200"].runtime
    assert cells["linear__perplexity__200"].measured is None
    assert cells["linear__passkey__300"].measured.protocol["task"] == "passkey"
    assert cells["linear__passkey__300"].scaling is None
    fresh = cells["yarn__perplexity__64"]
    assert fresh.factor == 4 and fresh.scaling["method"] == "yarn" and fresh.result.ppl > 1
    assert fresh.runs(MethodEntry("yarn", "yarn", 4)) and not fresh.runs(MethodEntry("yarn", "yarn", 2))


def _damaged(tmp_path, change) -> Path:
    data = json.loads((DATA / "cells" / "yarn__passkey__128.json").read_text())
    change(data)
    path = tmp_path / "cells" / "yarn__passkey__128.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(
    "change, said",
    [
        (lambda d: d.pop("task"), "task = (missing)"),
        (lambda d: d.pop("method_name"), "method_name = (missing)"),
        (lambda d: d.update(factor="x4"), "factor = 'x4': must be a number or null"),
        (lambda d: d.update(length=True), "length = True: must be a length in tokens"),
        (lambda d: d.update(params=None), "params = None: must be an object"),
        (lambda d: d.update(extra=1), f"extra = 1: not a key of {SCHEMA}"),
        (lambda d: d.update(runtime={"device": 0}), "runtime = {'device': 0}: must map names to strings"),
        (lambda d: d["measured"].pop("protocol"), "measured.protocol = (missing)"),
        (lambda d: d.update(scaling="yarn"), "scaling = 'yarn': must be an object"),
        (lambda d: d.update(load_avg="high"), "load_avg = 'high': must be a list of numbers"),
        (lambda d: d["result"].pop("accuracy"), "not a passkey result (a retrieval result needs 'depths' and"),
    ],
)
def test_a_damaged_cell_is_refused_in_one_line_naming_the_file_and_the_key(tmp_path, change, said):
    path = _damaged(tmp_path, change)
    with pytest.raises(CellFileError) as caught:
        SuiteCell.read(path)
    message = str(caught.value)
    assert message.startswith(f"cell file '{path}': ") and said in message and message.endswith(CELL_REMEDY)
    assert "\n" not in message and not isinstance(caught.value, NewerCellError)


def test_a_cell_naming_a_schema_is_refused_naming_the_version(tmp_path):
    path = _damaged(tmp_path, lambda d: d.update(schema="ropescale.suite.cell/2"))
    with pytest.raises(
        NewerCellError, match=r"has schema 'ropescale.suite.cell/2'; this ropescale reads .* upgrade it"
    ):
        SuiteCell.read(path)


def test_the_suite_recomputes_a_damaged_cell_of_its_own_and_refuses_a_newer_one(tmp_path):
    """A damaged cell the suite runs is recomputed (``is_done`` is False); one it does not run would be
    read by the report, so the run stops first naming it; a newer ropescale's cell is never overwritten."""
    from ropescale.evals.report.cell_keys import check_measured
    from ropescale.evals.suite.parse import suite_from_dict
    from ropescale.evals.suite.runner import SuiteRunner

    suite = suite_from_dict({"name": "t", "model": "unused", "methods": ["none"], "passkey": {"lengths": [128]}})
    runner = SuiteRunner(suite, tmp_path)
    ours = runner.cell_path(suite.methods[0], "passkey", 128)
    ours.parent.mkdir()
    ours.write_text(json.dumps({"method": "none", "task": "passkey"}))
    assert not runner.is_done(suite.methods[0], "passkey", 128)
    check_measured(runner)  # ours: recomputed, not refused
    stray = _damaged(tmp_path, lambda d: d.update(factor="x4"))
    with pytest.raises(RopescaleError, match="yarn__passkey__128.json': factor = 'x4'"):
        check_measured(runner)
    stray.unlink()
    ours.write_text(json.dumps({"schema": "ropescale.suite.cell/2"}))
    with pytest.raises(NewerCellError, match="ropescale.suite.cell/2"):
        check_measured(runner)


# -- the report reads the records: results.json and report.md unchanged ---------------------------------
def golden_suite(model_dir, **blocks):
    """The suite the golden cells were written by (``blocks``: more task blocks, e.g. ``ruler``)."""
    from ropescale.evals.suite.parse import suite_from_dict

    methods = [
        {"method": "saved"},
        {"method": "none"},
        {"method": "yarn", "factor": 4},
        {"method": "linear", "factor": 4},
    ]
    return suite_from_dict(
        {
            "name": "golden",
            "model": str(model_dir),
            "device": "cpu",
            "dtype": "float32",
            "data": "text.txt",
            "methods": methods,
            "perplexity": {"lengths": [64, 200], "mode": "nonoverlap", "max_tokens": 400},
            "passkey": {"lengths": [128, 300], "depths": [0.0, 1.0], "trials": 2},
            "needle": {"lengths": [300], "depths": [0.5], "trials": 2},
            "longppl": {"lengths": [200], "trunc_len": 64, "internal": 32},
            **blocks,
        }
    )


@pytest.mark.parametrize("partial", [False, True], ids=["finished", "in-progress"])
def test_results_json_and_the_report_are_what_main_wrote_for_the_same_cells(model_dir, tmp_path, partial):
    """``results.json`` and ``report.md`` of the fixture's cells, byte for byte as main's code
    (67e1bd4) wrote them from the same files (``tests/data/suite_cells/results*.json``, ``report*.md``;
    the folder and the model's paths read ``OUT`` and ``MODEL``). ``in-progress``: with the ``saved``
    row's unfinished passkey cell at 128 (``partial.json``) shown as ``--report-only`` shows it."""
    import shutil

    from ropescale.evals.report.aggregate import write_report

    out = tmp_path / "out"
    shutil.copytree(DATA / "cells", out / "cells")
    cells = [SuiteCell.from_json(json.loads((DATA / "partial.json").read_text()))] if partial else None
    write_report(golden_suite(model_dir), out, partial=cells)
    suffix = "-partial" if partial else ""
    for name, golden in (("results.json", f"results{suffix}.json"), ("report.md", f"report{suffix}.md")):
        written = (out / name).read_text(encoding="utf-8").replace(str(out), "OUT").replace(str(model_dir), "MODEL")
        assert written == (DATA / golden).read_text(encoding="utf-8"), name


def test_the_report_refuses_a_damaged_cell_in_one_line(model_dir, tmp_path):
    from ropescale.evals.report.aggregate import write_report

    _damaged(tmp_path, lambda d: d.pop("length"))
    with pytest.raises(CellFileError, match=r"yarn__passkey__128.json': length = \(missing\); remove it"):
        write_report(golden_suite(model_dir), tmp_path)


# -- results.json read back typed (evidence.read_results) ----------------------------------------------
def test_results_json_reads_back_as_a_typed_summary_and_the_same_evidence(tmp_path):
    from ropescale.evals.advice.evidence import read_results
    from ropescale.evals.report.results_schema import Ran, ResultsSummary
    from ropescale.evals.tasks.task_perplexity import PerplexityCell
    from ropescale.evals.tasks.task_retrieval import RetrievalCell

    data = json.loads((DATA / "results.json").read_text())
    summary = ResultsSummary.from_json(data, DATA / "results.json")
    assert summary.version == 2 and summary.labels == ("linear", "none", "saved", "yarn")
    assert summary.methods["saved"] == Ran("yarn", 4.0, {"original_max_position_embeddings": 256})
    assert summary.methods["none"] == Ran("none") and summary.methods["yarn"] == Ran("yarn", 4.0)
    assert isinstance(summary.results("passkey", "none")[128], RetrievalCell)
    assert isinstance(summary.results("perplexity", "saved")[64], PerplexityCell)
    assert summary.results("passkey", "saved") == {} and (summary.cells_finished, summary.cells_total) == (19, 24)

    ev = read_results(DATA / "results.json")
    assert ev.note == "golden suite, dtype float32, 19/24 cells" and ev.model == "MODEL" and ev.passkey_jitter == 0.125
    rows = {r.label: r for r in ev.rows}
    assert (rows["saved"].method, rows["saved"].factor, sorted(rows["saved"].ppl)) == ("yarn", 4.0, [64])
    assert rows["none"].method == "default" and rows["none"].passkey_trials == {128: 4, 300: 4}
    assert rows["yarn"].ppl[64] == data["tasks"]["perplexity"]["yarn"]["64"]["ppl"]
    # a passkey result that does not say its trials counts none (no interval is made up for it)
    for by_length in data["tasks"]["passkey"].values():
        for result in by_length.values():
            del result["trials"], result["length_trials"]
    (tmp_path / "results.json").write_text(json.dumps(data))
    assert all(
        not r.passkey_trials and r.passkey for r in read_results(tmp_path / "results.json").rows if r.label != "saved"
    )
    data["schema"] = "ropescale.results/9"
    (tmp_path / "results.json").write_text(json.dumps(data))
    with pytest.raises(RopescaleError, match="has schema 'ropescale.results/9'"):
        read_results(tmp_path / "results.json")
