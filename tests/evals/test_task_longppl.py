"""LongPPL as a row of the table of tasks (evals/tasks/task_longppl.py): a suite's ``longppl:`` block runs on
a tiny random model and reports what ``ropescale eval longppl`` reports for the same windows; its keys
are checked as ``longppl.<key>``; the command's flags are the settings' fields."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest
import torch
import yaml

from ropescale.cli.main import build_parser, main
from ropescale.errors import RopescaleError
from ropescale.evals.suite.parse import suite_from_dict
from ropescale.evals.tasks import longppl_run, task_table
from ropescale.evals.tasks.longppl import evaluator_spans
from ropescale.evals.tasks.report_cells import fmt
from ropescale.evals.tasks.task_longppl import LongPPLCell, LongPPLSettings
from tests.conftest import squeezed, tiny_model
from tests.evals.test_longppl import TEXT


@pytest.fixture(scope="module")
def model_dir(bytelevel_tokenizer, tmp_path_factory):
    m = tiny_model(seed=0, vocab_size=len(bytelevel_tokenizer), max_position_embeddings=512)
    with torch.no_grad():
        m.lm_head.weight.mul_(20.0)  # sharper predictions than random init's near-uniform ones
    path = tmp_path_factory.mktemp("longppl-model")
    m.save_pretrained(path)
    bytelevel_tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def loose_keys(monkeypatch):
    """Key tokens at looser thresholds (gain > 0 nats, loss < 8): a random model finds none at the
    authors' 2 and 2, and a LongPPL of None on both sides would compare nothing."""
    monkeypatch.setattr(longppl_run, "evaluator_spans", lambda *a: evaluator_spans(*a, 0.0, 8.0))


def _suite(model_dir, data, **block):
    return {
        "name": "lp",
        "model": str(model_dir),
        "device": "cpu",
        "dtype": "float32",
        "data": str(data),
        "methods": [{"method": "none"}, {"method": "yarn", "factor": 2}],
        "longppl": {"lengths": [200], "trunc_len": 64, "internal": 32, **block},
    }


def test_a_longppl_block_runs_in_a_suite_as_eval_longppl_reports_it(model_dir, loose_keys, tmp_path, capsys):
    data = tmp_path / "doc.txt"
    data.write_text(TEXT * 3)
    suite_file = tmp_path / "lp.yaml"
    suite_file.write_text(yaml.safe_dump(_suite(model_dir, data)))
    out = tmp_path / "suite"
    assert main(["eval", "suite", str(suite_file), "--output", str(out), "--no-progress"]) == 0
    summary = json.loads((out / "results.json").read_text())
    assert summary["cells_finished"] == summary["cells_total"] == 2
    cells = summary["tasks"]["longppl"]
    cell = json.loads((out / "cells" / "yarn__longppl__200.json").read_text())
    assert cell["measured"]["protocol"] == {"task": "longppl", "trunc_len": 64, "internal": 32}  # no seed
    assert cell["measured"]["data"] is not None  # the suite's data: its identity keys the cell
    assert LongPPLCell.from_json(cell["result"]).to_json() == cell["result"] == cells["yarn"]["200"]
    assert cell["result"]["evaluator"]["default"] and cell["result"]["evaluator"]["scaling"]["method"] == "none"

    # the same windows, key tokens and numbers as `ropescale eval longppl`
    argv = ["eval", "longppl", "--model", str(model_dir), "--methods", "none,yarn", "--factor", "2"]
    argv += ["--lengths", "200", "--data", str(data), "--trunc-len", "64", "--internal", "32"]
    assert main([*argv, "--device", "cpu", "--dtype", "float32", "--output", str(tmp_path / "cli")]) == 0
    cli = {c["label"]: c["result"] for c in json.loads((tmp_path / "cli" / "results.json").read_text())["cells"]}
    for label, ours in (("none", cells["none"]["200"]), ("yarn-x2", cells["yarn"]["200"])):
        assert ours["key_tokens"] == cli[label]["key_tokens"] > 0 and ours["tokens"] == cli[label]["tokens"] == 200
        assert ours["longppl"] == pytest.approx(cli[label]["longppl"], rel=1e-6)
        assert ours["ppl"] == pytest.approx(cli[label]["ppl"], rel=1e-6)
    assert cells["none"]["200"]["ppl"] != cells["yarn"]["200"]["ppl"]  # each cell scored its own method

    report = squeezed((out / "report.md").read_text())
    section = report.split("## LongPPL (arXiv 2410.23771)")[1].split("## ")[0]
    assert "Key tokens chosen by the evaluated model itself, unscaled (default)" in section
    assert "loss with the 64-token window" in section and "(stride 32)" in section
    assert f"| yarn ×2 | {fmt(cells['yarn']['200']['longppl'], 3)} |" in section
    assert f"| none | {fmt(cells['none']['200']['ppl'], 3)} |" in section
    assert f"| none | {cells['none']['200']['key_tokens']} / 200 |" in section


def test_the_report_names_another_evaluator_and_a_cell_without_key_tokens(model_dir, tmp_path):
    from ropescale.evals.report.aggregate import write_report
    from ropescale.evals.report.cell_record import SuiteCell

    raw = _suite(model_dir, tmp_path / "doc.txt", evaluator="org/judge", evaluator_method="yarn", evaluator_factor=2)
    suite = suite_from_dict(raw)
    assert suite.settings("longppl").evaluator_factor == 2
    report = squeezed(write_report(suite, tmp_path)["markdown"])  # no cell yet: the settings' evaluator
    assert "Key tokens chosen by org/judge with yarn-x2:" in report and "| none | — |" in report
    judge = longppl_run.evaluator_record("m", None, None, 64, 32)
    (tmp_path / "cells").mkdir()
    result = {"longppl": None, "ppl": 3.0, "key_tokens": 0, "tokens": 200, "evaluator": judge}
    record = SuiteCell.of(suite.methods[0], "longppl", 200, None, result).to_json()
    (tmp_path / "cells" / "none__longppl__200.json").write_text(json.dumps(record))
    report = squeezed(write_report(suite, tmp_path)["markdown"])
    assert "the evaluated model itself, unscaled (default)" in report and "| none | n/a (no key tokens) |" in report


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ({"trunc": 64}, "unknown longppl key 'trunc'; known: lengths, data, documents, evaluator"),
        ({"documents": 0}, "longppl.documents must be a positive integer, got 0"),
        ({"evaluator_method": "yarrn"}, "longppl.evaluator_method: unknown method 'yarrn'"),
        ({"evaluator_factor": "x"}, "longppl.evaluator_factor must be a number or null, got 'x'"),
        ({"evaluator_method": "yarn"}, "longppl.evaluator_method yarn needs a factor (longppl.evaluator_factor)"),
        ({"trunc_len": 256}, "longppl.trunc_len 256 must be below every length (got 200): no token would be scored"),
        ({"internal": "1k"}, None),  # a length, as the suite writes lengths
    ],
)
def test_a_bad_longppl_key_is_refused_in_one_line_naming_it(model_dir, tmp_path, capsys, block, message):
    raw = _suite(model_dir, tmp_path / "doc.txt", **block)
    if message is None:
        assert suite_from_dict(raw).settings("longppl").internal == 1024
        return
    with pytest.raises(RopescaleError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        suite_from_dict(raw)
    suite_file = tmp_path / "bad.yaml"
    suite_file.write_text(yaml.safe_dump(raw))
    assert main(["eval", "suite", str(suite_file), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "out").exists()


def test_a_length_the_data_does_not_reach_is_refused_before_the_weights_load(model_dir, tmp_path, capsys):
    data = tmp_path / "doc.txt"
    data.write_text(TEXT[:300])
    raw = _suite(model_dir, data)
    suite_file = tmp_path / "short.yaml"
    suite_file.write_text(yaml.safe_dump(raw))
    assert main(["eval", "suite", str(suite_file), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "longppl length 200: no document of the data holds 200 tokens" in err[0], err


def test_the_flags_of_each_task_command_are_its_settings_fields():
    """Every settings field is a flag of ``ropescale eval <task>`` (under its ``dest``) and, for the
    commands with a runner of their own, every flag is a settings field or one of the command's own:
    a field added without a flag, or a task flag written by hand, fails here."""
    from ropescale.evals.tasks.longppl import INTERNAL, TRUNC_LEN

    parser = build_parser()
    eval_commands = next(a for a in parser._actions if a.dest == "command").choices["eval"]
    commands = next(a for a in eval_commands._actions if a.dest == "eval_command").choices
    bare = argparse_dests(commands["longppl"]) - {f.name for f in fields(LongPPLSettings)}
    own = {"help", "model", "methods", "factor", "param", "lengths", "device", "dtype", "attn_implementation"}
    own |= {"shipped_context"}  # --shipped-context: S, where a composed method starts (issue 51)
    assert bare == own | {"output"}  # longppl: the command's scalings, lengths, model, runtime, output
    ruler = argparse_dests(commands["ruler"]) - {f.name for f in fields(task_table.get("ruler").settings)}
    assert ruler == own - {"methods"} | {"method", "output", "no_progress"}
    for row in task_table.TABLE.values():
        dests = argparse_dests(commands[row.name])
        for f in fields(row.settings):
            assert f.metadata.get("dest", f.name) in dests, f"{row.name}.{f.name} has no flag"
    settings = task_table.get("longppl").settings()
    args = parser.parse_args(["eval", "longppl", "--lengths", "8k"])
    from ropescale.options import from_arguments

    assert from_arguments(LongPPLSettings, args) == LongPPLSettings(data="austen")  # the defaults, as before
    assert (settings.trunc_len, settings.internal) == (TRUNC_LEN, INTERNAL)  # the authors', one value each


def argparse_dests(parser) -> set[str]:
    return {a.dest for a in parser._actions}
