"""Resumable cells know what they measured: re-running into a results folder with another model
(another folder, or the same folder with other weights), other data or another protocol stops in one
line naming the difference, before anything is written; the same run again reuses its cells."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ropescale.cli.main import main
from ropescale.evals.report.cell_keys import measured
from ropescale.evals.suite.parse import suite_from_dict
from tests.conftest import tiny_model
from tests.training.conftest import char_tokenizer


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("keys")
    for name, seed in (("A", 0), ("B", 1)):
        tiny_model(seed=seed, attn_implementation="sdpa").save_pretrained(root / name)
        char_tokenizer().save_pretrained(root / name)
    (root / "t1.txt").write_text("The cat sat on the mat and looked at the rain. " * 40)
    (root / "t2.txt").write_text("A dog ran in the park and barked at a bird. " * 40)
    return root


def _eval(capsys, root, out, model="A", data="t1.txt", *extra):
    capsys.readouterr()
    argv = ["eval", "perplexity", "--model", root / model, "--data", root / data, "--lengths", "32"]
    code = main([str(a) for a in [*argv, "--max-tokens", "64", "--output", out, "--no-progress", *extra]])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("ropescale: error")]
    return code, err


def test_changed_model_data_or_mode_stops_naming_the_difference(models, tmp_path, capsys):
    out = tmp_path / "d"
    assert _eval(capsys, models, out) == (0, [])
    cell = out / "cells" / "none__perplexity__32.json"
    before = cell.read_text()
    assert json.loads(before)["measured"]["model"]["name"] == str(models / "A")
    stops = {
        "model": ((models, out, "B"), f"model: '{models / 'A'}' -> '{models / 'B'}'"),
        "data": ((models, out, "A", "t2.txt"), f"data: '{models / 't1.txt'}' -> '{models / 't2.txt'}'"),
        "mode": ((models, out, "A", "t1.txt", "--mode", "longlora"), "protocol.mode: 'yarn' -> 'longlora'"),
        "budget": ((models, out, "A", "t1.txt", "--max-tokens", "96"), "protocol.max_tokens: 64 -> 96"),
    }
    for what, (args, fragment) in stops.items():
        code, err = _eval(capsys, *args[:2], *args[2:]) if len(args) > 2 else _eval(capsys, *args)
        assert code == 2 and len(err) == 1, (what, err)
        assert f"results folder '{out}' holds none__perplexity__32.json, measured with a different {fragment}" in err[0]
        assert cell.read_text() == before, what
    assert _eval(capsys, models, out) == (0, [])  # the same run: the cell is reused, not recomputed
    assert cell.read_text() == before


def test_same_folder_with_other_weights_stops(models, tmp_path, capsys):
    model = tmp_path / "M"
    shutil.copytree(models / "A", model)
    out = tmp_path / "d"
    assert _eval(capsys, tmp_path, out, "M", models / "t1.txt") == (0, [])
    shutil.copy(models / "B" / "model.safetensors", model / "model.safetensors")  # fine-tuned in place
    code, err = _eval(capsys, tmp_path, out, "M", models / "t1.txt")
    assert code == 2 and f"measured with a different model content: '{model}' had fingerprint" in err[0], err


def test_the_same_model_and_data_under_other_paths_reuse_the_cells(models, tmp_path, capsys, monkeypatch):
    """A local model or data file is its content, not its path: a checkout at another root, a folder moved
    or a relative path given where an absolute one was resumes the folder's cells (a sentinel number
    survives: reused, not recomputed). The cell keeps the name it was measured under."""
    for name in ("M", "t.txt"):
        src = models / ("A" if name == "M" else "t1.txt")
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / name)
    out = tmp_path / "d"
    assert _eval(capsys, tmp_path, out, "M", "t.txt") == (0, [])
    cell = out / "cells" / "none__perplexity__32.json"
    record = json.loads(cell.read_text())
    cell.write_text(json.dumps({**record, "result": {**record["result"], "ppl": 1.0}}))
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    for name in ("M", "t.txt"):
        (tmp_path / name).rename(moved / name)
    assert _eval(capsys, moved, out, "M", "t.txt") == (0, [])
    monkeypatch.chdir(moved)
    assert _eval(capsys, Path("."), out, "M", "t.txt") == (0, [])  # relative paths: the same files
    kept = json.loads(cell.read_text())
    assert kept["result"]["ppl"] == 1.0 and kept["measured"]["model"]["name"] == str(tmp_path / "M")
    shutil.copy(models / "B" / "model.safetensors", moved / "M" / "model.safetensors")  # then fine-tuned in place
    code, err = _eval(capsys, Path("."), out, "M", "t.txt")
    assert code == 2 and f"measured with a different model: '{tmp_path / 'M'}' -> 'M'" in err[0], err


def test_a_model_recorded_without_its_content_still_matches_by_name():
    """A cell written before cells recorded fingerprints names its model only: the content the current run
    lends it (:func:`legacy`) must not make another name match."""
    from ropescale.evals.tasks.run_folder import matches

    ours = {"model": {"name": "/a/m", "fingerprint": "f"}, "data": None, "protocol": {"seed": 0}}
    assert matches({"model": {"name": "/a/m"}, "protocol": {"seed": 0}}, ours)
    assert not matches({"model": {"name": "/b/m"}, "protocol": {"seed": 0}}, ours)
    assert matches({"model": {"name": "/b/m", "fingerprint": "f"}, "data": None, "protocol": {"seed": 0}}, ours)
    assert not matches({"model": {"name": "/a/m", "fingerprint": "g"}, "data": None, "protocol": {"seed": 0}}, ours)
    assert not matches({"model": {"name": "/a/m", "fingerprint": "f"}, "data": None, "protocol": {"seed": 1}}, ours)
    corpus = {**ours, "data": {"name": "austen"}}  # a corpus has no fingerprint: its name is its identity
    assert not matches({**corpus, "data": {"name": "bible"}}, corpus)


def test_cells_of_an_unkeyed_earlier_run_are_recomputed_or_refused(models, tmp_path, capsys):
    out = tmp_path / "d"
    assert _eval(capsys, models, out) == (0, [])
    cell = out / "cells" / "none__perplexity__32.json"
    record = json.loads(cell.read_text())
    record.pop("measured")
    record["result"]["ppl"] = 1.0  # an old number that must not survive
    cell.write_text(json.dumps(record))
    assert _eval(capsys, models, out) == (0, [])
    assert json.loads(cell.read_text())["result"]["ppl"] != 1.0 and "measured" in json.loads(cell.read_text())
    other = out / "cells" / "yarn__perplexity__32.json"
    other.write_text(json.dumps({**record, "method": "yarn"}))  # an unkeyed cell this suite does not have
    code, err = _eval(capsys, models, out)
    assert code == 2 and "holds yarn__perplexity__32.json, written without a record of its model and data" in err[0]


def test_retrieval_protocol_keys_trials_and_seed():
    base = {"name": "s", "model": "m", "methods": [{"method": "none"}], "passkey": {"lengths": [64], "trials": 2}}
    identity = {"model": {"name": "m", "fingerprint": "x"}, "data": {"name": None}}
    key = measured(suite_from_dict(base), identity, "passkey")
    assert key["protocol"]["trials"] == 2 and key["protocol"]["seed"] == 0 and key["data"] is None
    assert measured(suite_from_dict({**base, "seed": 1}), identity, "passkey") != key
    assert measured(suite_from_dict({**base, "passkey": {"lengths": [64], "trials": 3}}), identity, "passkey") != key
    assert measured(suite_from_dict({**base, "passkey": {"lengths": [128], "trials": 2}}), identity, "passkey") == key


def test_report_only_needs_no_model(models, tmp_path, capsys):
    model = tmp_path / "M"
    shutil.copytree(models / "A", model)
    out = tmp_path / "d"
    assert _eval(capsys, tmp_path, out, "M", models / "t1.txt") == (0, [])
    shutil.rmtree(model)  # the results folder read elsewhere
    capsys.readouterr()
    assert main(["eval", "suite", str(out / "suite.yaml"), "--output", str(out), "--report-only"]) == 0
    assert "finished 1/1 cells (nothing run)" in capsys.readouterr().out


@pytest.mark.parametrize("attention_factor, legacy_reused", [(1.07, False), (None, True)])
def test_a_cell_records_the_scaling_it_ran_and_older_cells_count_only_at_the_defaults(
    models, tmp_path, capsys, attention_factor, legacy_reused
):
    """A checkpoint saved with YaRN x4 at its own attention factor is measured at that factor; a cell from
    before cells recorded their scaling ran the method's defaults, so it counts only where those run now."""
    import ropescale

    model = tmp_path / "saved"
    params = {} if attention_factor is None else {"attention_factor": attention_factor}
    scaled = ropescale.patch(tiny_model(seed=0, attn_implementation="sdpa"), "yarn", factor=4, **params)
    ropescale.save_pretrained(scaled, model, tokenizer=char_tokenizer())
    out = tmp_path / "d"
    assert _eval(capsys, tmp_path, out, "saved", models / "t1.txt", "--method", "yarn", "--factor", "4") == (0, [])
    cell = out / "cells" / "yarn__perplexity__32.json"
    record = json.loads(cell.read_text())
    assert record["scaling"]["params"]["attention_factor"] == attention_factor
    for older, reused in (({"scaling": None}, legacy_reused), ({"attention_factor": 1.5}, False), ({}, True)):
        changed = {**record, "result": {**record["result"], "ppl": 1.0}}  # a number that survives only if reused
        if "scaling" in older:
            changed.pop("scaling")  # written before cells recorded it
        elif older:
            changed["scaling"] = {**record["scaling"], "params": {**record["scaling"]["params"], **older}}
        cell.write_text(json.dumps(changed))
        assert _eval(capsys, tmp_path, out, "saved", models / "t1.txt", "--method", "yarn", "--factor", "4") == (0, [])
        assert (json.loads(cell.read_text())["result"]["ppl"] == 1.0) is reused, older


def test_max_tokens_bounds_the_cell_not_each_document(models, tmp_path, capsys):
    """``max_tokens`` is the tokens a cell scores. Before ``budget``, each document was cut to it, so a cell of
    two documents scored twice what it said (issue 51's shipped suite scored Emma's 131,072 tokens and 55,608 of
    Mansfield Park). ``budget: document`` keeps the old protocol, and cells of it resume; cells written before
    the key (their protocol names none) are the old protocol, and a run of the new one stops naming it."""
    (models / "two").mkdir(exist_ok=True)  # two documents of 80 characters (tokens): each longer than the budget's half
    (models / "two" / "a.txt").write_text(("The cat sat on the mat and looked at the rain. " * 2)[:80])
    (models / "two" / "b.txt").write_text(("A dog ran in the park and barked at a bird. " * 2)[:80])
    out = tmp_path / "cell"
    assert _eval(capsys, models, out, "A", "two") == (0, [])
    cell = json.loads((out / "cells" / "none__perplexity__32.json").read_text())
    assert cell["result"]["tokens_scored"] <= 64 and cell["measured"]["protocol"]["budget"] == "cell"
    old = tmp_path / "document"
    assert _eval(capsys, models, old, "A", "two", "--budget", "document") == (0, [])
    path = old / "cells" / "none__perplexity__32.json"
    cell = json.loads(path.read_text())
    assert cell["result"]["tokens_scored"] > 64 and "budget" not in cell["measured"]["protocol"]
    code, err = _eval(capsys, models, old, "A", "two")
    assert code == 2 and "measured with a different protocol.budget: 'document' -> 'cell'" in err[0], err
    before = path.read_text()
    assert _eval(capsys, models, old, "A", "two", "--budget", "document") == (0, []) and path.read_text() == before


def test_a_cells_documents_stop_where_its_budget_is_spent():
    from ropescale.evals.tasks.task_perplexity import cell_documents

    docs = [list(range(100)), list(range(50)), list(range(40))]
    assert [len(d) for d in cell_documents(docs, 130, 32)] == [100]  # 30 left: less than a window
    assert [len(d) for d in cell_documents(docs, 140, 32)] == [100, 40]
    assert [len(d) for d in cell_documents(docs, 64, 32)] == [64]
    assert [len(d) for d in cell_documents(docs, 1000, 32)] == [100, 50, 40]
