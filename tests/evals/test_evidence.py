"""Measured results for ``ropescale recommend``: the shipped measurements file and runs' results.json."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from ropescale._lock import output_lock
from ropescale.errors import RopescaleError
from ropescale.evals.advice import evidence
from ropescale.evals.advice.evidence import MEASURED_DIR, find_evidence, load_measured, shipped_evidence
from ropescale.evals.report import cell_keys
from tests.conftest import load_script

ROOT = Path(__file__).resolve().parents[2]


def test_shipped_measurements_load_with_their_commands():
    shipped = {ev.source: ev for ev in shipped_evidence()}
    smollm, frontier = shipped["evals/measured/smollm2-135m.json"], shipped["evals/measured/smollm2-135m-frontier.json"]
    finetune = shipped["evals/measured/smollm2-135m-finetune.json"]
    assert finetune.budget == "fine-tune" and [r.label for r in finetune.rows][:3] == [
        "none",
        "yarn",
        "fine-tuned yarn",
    ]
    assert all(row.commands and row.passkey_trials.keys() == row.passkey.keys() for row in finetune.rows)
    assert frontier.budget == smollm.budget == "training-free"
    assert frontier.source == "evals/measured/smollm2-135m-frontier.json" and frontier.original_context == 8192
    assert all(row.commands and row.passkey_trials.keys() == row.passkey.keys() for row in frontier.rows if row.passkey)
    assert frontier.find("self_extend", factor=2.0).ppl[16384] == 29.81
    assert not [r for r in frontier.rows if r.factor == 4.0]  # ×4 lives in the 30-prompt file alone
    at_4x = shipped["evals/measured/smollm2-135m-frontier-30.json"]
    assert at_4x.budget == "training-free" and {r.factor for r in at_4x.rows} == {None, 4.0}
    assert at_4x.find("default").passkey_trials == {4096: 30, 8192: 30}  # the native bar on 30 prompts
    assert all(
        row.commands == ("ropescale eval suite smollm2-frontier-32k-30 --output runs/smollm2-frontier-32k-30",)
        for row in at_4x.rows
    )
    assert smollm.source == "evals/measured/smollm2-135m.json" and smollm.model == "smollm2-135m"
    assert smollm.original_context == 8192 and smollm.note
    assert all(row.commands and (row.ppl or row.passkey) for row in smollm.rows)
    yarn, af1 = smollm.find("yarn"), smollm.find("yarn", attention_factor=1.0)
    assert yarn.factor == 4.0 and yarn.ppl[16384] == 32.68 and yarn.passkey == {4096: 0.0, 16384: 1.0, 32768: 1.0}
    assert af1.label == "yarn attention_factor=1" and af1.ppl[2048] == 29.83
    assert smollm.find("default").factor is None and smollm.find("dynamic_ntk").ppl[32768] == 44.94
    assert smollm.commands[0] == "ropescale eval suite smollm2-x4-full --output runs/smollm2-x4-full"


def test_every_shipped_command_names_something_that_exists(tmp_path):
    """A command is only worth shipping if it can be run: suites, benchmark scripts and methods exist."""
    from ropescale.cli.main import build_parser
    from ropescale.evals.suite.parse import load_suite

    parser = build_parser()
    extension = load_script("benchmarks/bench_extension.py")
    for command in (c for ev in shipped_evidence() for c in ev.commands):
        argv = shlex.split(command)
        while argv and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", argv[0]):  # the shell's VAR=value before it
            argv = argv[1:]
        if argv[0] == "python":
            assert (ROOT / argv[1]).is_file(), command
            if argv[1] == "benchmarks/bench_extension.py":  # every recipe takes the overrides it ran with
                args = extension.parse_args(argv[2:])
                extension.check_recipes(tmp_path, {"base", "finetuned", "control"}, args.overrides, args.factor)
            continue
        assert argv[0] == "ropescale", command
        args = parser.parse_args(argv[1:])  # flags and values the CLI accepts today
        if args.eval_command == "suite":
            assert load_suite(args.suite).cells(), command


def test_the_full_suite_is_the_main_suite_without_its_skips():
    from ropescale.evals.suite.parse import load_suite

    main, full = load_suite("smollm2-x4"), load_suite("smollm2-x4-full")
    assert [(m.method, m.factor) for m in main.methods] == [(m.method, m.factor) for m in full.methods]
    assert (main.perplexity, main.passkey) == (full.perplexity, full.passkey)

    def keys(suite):
        return {(m.label, task, n) for m, task, n in suite.cells()}

    assert keys(main) < keys(full) and len(keys(full)) - len(keys(main)) == 6


def _write(tmp_path, rows, **top):
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"model": "m", "original_context": 1024, "note": "n", "rows": rows, **top}))
    return path


def test_load_measured_merges_a_rows_commands(tmp_path):
    rows = [
        {
            "label": "dyn",
            "method": "dynamic",
            "factor": 2,
            "measured": [
                {"command": "a", "ppl": {"1024": 10.5}},
                {"command": "b", "ppl": {"2048": 11}, "passkey": {"2048": 0.5}},
            ],
        }
    ]
    ev = load_measured(_write(tmp_path, rows))
    (row,) = ev.rows
    assert (row.method, row.factor, row.params) == ("dynamic_ntk", 2.0, {})  # the registry's name
    assert row.ppl == {1024: 10.5, 2048: 11.0} and row.passkey == {2048: 0.5} and row.commands == ("a", "b")
    assert ev.source == str(tmp_path / "m.json") and ev.original_context == 1024


def test_a_later_stage_joins_the_shipped_file_without_losing_a_cell(tmp_path):
    def row(label, command, ppl=None, passkey=None, trials=None, **params):
        measured = {"command": command, **({"ppl": ppl} if ppl else {})}
        if passkey:
            measured.update(passkey=passkey, passkey_trials=trials)
        return {"label": label, "method": "yarn", "factor": 4.0, "params": params, "measured": [measured]}

    head = {"model": "m", "original_context": 1024, "budget": "training-free", "note": "n"}
    old = {
        **head,
        "rows": [row("yarn", "stage 1", {"2048": 30.7}, {"4096": 0.4, "8192": 0.5}, {"4096": 30, "8192": 12})],
    }
    new = {
        **head,
        "note": "other",
        "rows": [
            row("yarn", "stage 2", {"2048": 31.0}, {"8192": 0.9, "16384": 0.8}, {"8192": 30, "16384": 30}),
            row("yarn-af1", "stage 2", passkey={"4096": 0.8}, trials={"4096": 30}, attention_factor=1.0),
        ],
    }
    merged, lines = evidence.merge_shipped(old, new)
    assert lines == [
        "yarn ppl 2k: kept",  # the file's cell stays: same prompts, measured already
        "yarn passkey 8k: replaced",  # 12 prompts there (in progress), 30 now
        "yarn passkey 16k: added",
        "yarn-af1 passkey 4k: added",
    ]
    assert merged["note"] == "n" and old["rows"][0]["measured"][0]["passkey"]["8192"] == 0.5  # old untouched
    path = tmp_path / "merged.json"
    path.write_text(json.dumps(merged))
    ev = load_measured(path)
    yarn, af1 = ev.rows
    assert yarn.ppl == {2048: 30.7} and yarn.passkey == {4096: 0.4, 8192: 0.9, 16384: 0.8}
    assert yarn.passkey_trials == {4096: 30, 8192: 30, 16384: 30} and yarn.commands == ("stage 1", "stage 2")
    assert af1.params == {"attention_factor": 1.0} and af1.commands == ("stage 2",)
    with pytest.raises(RopescaleError, match="original_context 2048, the file 1024"):
        evidence.merge_shipped(old, {**new, "original_context": 2048})
    assert evidence.write_shipped(tmp_path / "new" / "e.json", old) == []  # a new file: written as it is
    assert evidence.write_shipped(tmp_path / "new" / "e.json", new)[-1] == "yarn-af1 passkey 4k: added"
    with output_lock(tmp_path / "new" / "e.json", folder=False):  # another writer holds it: refused
        with pytest.raises(RopescaleError, match="being written by another"):
            evidence.write_shipped(tmp_path / "new" / "e.json", new)


def test_cells_of_another_machine_kind_never_join_a_file(tmp_path):
    def cells(name, *runtimes):
        (tmp_path / name / "cells").mkdir(parents=True)
        for i, runtime in enumerate(runtimes):
            (tmp_path / name / "cells" / f"c{i}.json").write_text(json.dumps({"runtime": runtime}))
        return tmp_path / name

    amx = {"device": "cpu", "dtype": "bfloat16", "attention": "sdpa", "kernels": "amx"}
    legacy = {k: v for k, v in amx.items() if k != "kernels"}  # written before kernels were recorded
    gpu = {"device": "cuda", "dtype": "bfloat16", "attention": "sdpa"}
    assert cell_keys.cells_runtime([cells("a", amx, legacy), cells("b")]) == amx
    assert cell_keys.cells_runtime([cells("none")]) is None
    with pytest.raises(
        RopescaleError, match="cells computed on cpu / bfloat16 .amx. / sdpa and on cpu / bfloat16 .avx512"
    ):
        cell_keys.cells_runtime([cells("c", amx, {**amx, "kernels": "avx512_bf16"})])
    with pytest.raises(RopescaleError, match="one file, one machine kind"):
        cell_keys.cells_runtime([cells("d", amx), cells("e", gpu)])

    head = {"model": "m", "original_context": 1024, "budget": "training-free", "note": "n"}
    row = {"label": "yarn", "method": "yarn", "factor": 4.0, "params": {}}
    ev = evidence.Evidence("", "m", "n", (evidence.Measured("yarn", "yarn", 4.0, ppl={2048: 30.0}, commands=("c",)),))
    shipped = evidence.shipped_dict(ev, 1024, "n", runtime=amx)
    assert shipped["runtime"] == amx and "runtime" not in evidence.shipped_dict(ev, 1024, "n")
    path = tmp_path / "e.json"
    evidence.write_shipped(path, shipped)
    later = {**head, "runtime": gpu, "rows": [{**row, "measured": [{"command": "g", "passkey": {"4096": 0.5}}]}]}
    with pytest.raises(
        RopescaleError, match="computed on cuda / bfloat16 / sdpa, the file's on cpu / bfloat16 .amx. / sdpa"
    ):
        evidence.write_shipped(path, later)
    assert json.loads(path.read_text()) == shipped  # untouched
    assert evidence.write_shipped(path, {**later, "runtime": legacy}) == ["yarn passkey 4k: added"]  # same kind
    unrecorded = {**head, "rows": [{**row, "measured": [{"command": "c", "ppl": {"2048": 30.0}}]}]}
    assert evidence.merge_shipped(unrecorded, later)[0].get("runtime") is None  # an old file stays without


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"label": "x", "method": "yarn", "measured": []}, r"rows\[0\] needs a label, a method and a non-empty"),
        ({"method": "yarn", "measured": [{"ppl": {"1024": 3.0}}]}, r"measured\[0\] needs the command"),
        ({"method": "yarn", "measured": [{"command": " ", "ppl": {}}]}, r"measured\[0\] needs the command"),
        ({"method": "yarn", "measured": [{"command": "c", "ppl": {"1k": 3.0}}]}, r"measured\[0\]\.ppl: '1k'"),
        ({"method": "yarn", "measured": [{"command": "c", "passkey": {"1024": 80}}]}, r"passkey: '1024': 80 is not"),
        ({"method": "yarn", "measured": [{"command": "c", "ppl": [3.0]}]}, "must map lengths to numbers"),
        ({"method": "se-g8", "measured": [{"command": "c"}]}, r"rows\[0\]\.method: 'se-g8' is not a method ropescale"),
        (
            {
                "method": "yarn",
                "measured": [{"command": "c", "ppl": {"1024": 3.0}}, {"command": "d", "ppl": {"1024": 4}}],
            },
            r"measured\[1\]\.ppl: length 1024 is measured twice in this row",
        ),
    ],
)
def test_bad_measurements_name_the_file_and_row(tmp_path, row, message):
    with pytest.raises(RopescaleError, match=message) as info:
        load_measured(_write(tmp_path, [row]))
    assert "m.json: rows[0]" in str(info.value) and "\n" not in str(info.value)


def test_unreadable_measurements(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(RopescaleError, match="measurements '.*bad.json' cannot be read"):
        load_measured(bad)
    bad.write_text("[]")
    with pytest.raises(RopescaleError, match="need 'model', 'original_context', 'note' and 'rows'"):
        load_measured(bad)


def test_find_evidence_puts_runs_of_the_same_model_first(tmp_path, monkeypatch):
    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    (run / "results.json").write_text(
        json.dumps({"model": "mine", "tasks": {"perplexity": {"yarn": {"2048": {"ppl": 9.0}}}}})
    )
    found = find_evidence("mine", root=tmp_path)
    shipped = [
        f"evals/measured/smollm2-135m{s}.json"
        for s in (
            "-finetune-400steps-jitter",
            "-finetune-400steps",
            "-finetune-cpu-x2-640steps",
            "-finetune-cpu-x2",
            "-finetune-cpu-x4-640steps",
            "-finetune-recall-400steps-jitter",
            "-finetune-recall-60steps-jitter",
            "-finetune-recall-lr1e-4-400steps-jitter",
            "-finetune-recall-lr1e-4-400steps-seed1-jitter",
            "-finetune-recall-lr1e-4-600steps-jitter",
            "-finetune-recall-lr1e-4-60steps-jitter",
            "-finetune-recall-lr1e-4-800steps-jitter",
            "-finetune-recall-lr3e-4-175steps-jitter",
            "-finetune-x8-400steps-jitter",
        )
        + ("-finetune",)
        + ("-frontier-30-jitter", "-frontier-30", "-frontier", "")
    ]
    assert [e.source for e in found] == [str(run / "results.json"), *shipped]
    assert found[0].find("yarn").ppl == {2048: 9.0} and not found[0].rows[0].commands
    assert [e.source for e in find_evidence("other", root=tmp_path)] == shipped
    assert MEASURED_DIR == Path(evidence.__file__).parents[1] / "measured"


def test_every_shipped_file_names_the_runtime_that_computed_it():
    for path in sorted(MEASURED_DIR.glob("*.json")):
        runtime = json.loads(path.read_text()).get("runtime") or {}
        assert runtime.get("device") in ("cpu", "cuda") and runtime.get("dtype"), path.name


def test_jittered_passkey_cells_never_join_a_file_of_fixed_ones(tmp_path):
    def cells(name, *jitters):
        (tmp_path / name / "cells").mkdir(parents=True)
        for i, jitter in enumerate(jitters):
            protocol = {"task": "passkey", **({} if jitter is None else {"jitter": jitter})}
            cell = tmp_path / name / "cells" / f"m__passkey__{4096 * (i + 1)}.json"
            cell.write_text(json.dumps({"measured": {"protocol": protocol}}))
        return tmp_path / name

    assert cell_keys.cells_jitter([cells("fixed", None, None)]) == 0.0
    assert cell_keys.cells_jitter([cells("j", 0.125, 0.125)]) == 0.125
    with pytest.raises(RopescaleError, match="passkey cells placed with jitter 0 and 0.125: one file, one placement"):
        cell_keys.cells_jitter([cells("mixed", None, 0.125)])

    ev = evidence.Evidence(
        "", "m", "n", (evidence.Measured("yarn", "yarn", 4.0, passkey={4096: 0.5}, commands=("c",)),)
    )
    fixed, jittered = evidence.shipped_dict(ev, 1024, "n"), evidence.shipped_dict(ev, 1024, "n", passkey_jitter=0.125)
    assert "passkey_jitter" not in fixed and jittered["passkey_jitter"] == 0.125
    path = tmp_path / "e.json"
    evidence.write_shipped(path, fixed)
    with pytest.raises(RopescaleError, match="placed its passkey needles at jitter 0.125, the file at fixed depths"):
        evidence.write_shipped(path, jittered)
    assert json.loads(path.read_text()) == fixed
    evidence.write_shipped(tmp_path / "j.json", jittered)
    assert evidence.load_measured(tmp_path / "j.json").rows[0].passkey == {4096: 0.5}
