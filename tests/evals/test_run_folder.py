"""Issue 52, "results replaced or mixed": ``eval ruler`` and ``eval longppl`` keep the suite runner's
guarantees (:mod:`ropescale.evals.tasks.run_folder`), tried from outside on tiny random models.

A cell is keyed by the model's content, seed, samples and data: another one at the same path is refused
naming the difference (never replaced, never reused); one writer per folder; a file of a newer schema, or
a folder of another task, is refused and left byte for byte; a cell lm-eval fills short is refused before
the weights load, and one stored short before is never counted done. The shipped cells and a journal
written under today's keys are read, counted and resumed under the new ones."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ropescale.cli.main import main
from ropescale.evals.tasks.generation import PromptJournal
from tests.conftest import tiny_model
from tests.evals.ruler_fixtures import ruler_tokenizer, save_ruler_model


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Two tiny RULER models of other weights, same tokenizer: ``u0`` and ``u1``."""
    tok = ruler_tokenizer()
    root = tmp_path_factory.mktemp("models")
    return {name: save_ruler_model(root / name, tok, seed) for name, seed in (("u0", 0), ("u1", 1))}


def _ruler(model: str, out: Path, *extra: str) -> int:
    argv = ["eval", "ruler", "--model", model, "--method", "none", "--tasks", "niah_single_1", "--lengths", "256"]
    return main([*argv, "--samples", "1", "--device", "cpu", "--no-progress", "--output", str(out), *extra])


def _bytes(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


#: the journal's own record, before any test wraps it
_RECORD = PromptJournal.record
CELL = "none__ruler__256.json"  # eval ruler's cell: the suite runner's, every task asked at the length


def _cut_after_the_first_prompt(monkeypatch) -> None:
    """Each decoded prompt is journaled as a run journals it, then the run stops (a sitting cut short)."""

    def killed(self, prompt, max_new_tokens, text, *cost):
        _RECORD(self, prompt, max_new_tokens, text, *cost)
        raise KeyboardInterrupt

    monkeypatch.setattr(PromptJournal, "record", killed)


def _count_decoded(monkeypatch) -> list[str]:
    """The texts decoded from here on (a prompt taken from a journal is not decoded, so not counted)."""
    decoded: list[str] = []

    def counted(self, prompt, max_new_tokens, text, *cost):
        _RECORD(self, prompt, max_new_tokens, text, *cost)
        decoded.append(text)

    monkeypatch.setattr(PromptJournal, "record", counted)
    return decoded


def test_another_model_seed_or_samples_into_the_folder_is_refused_and_the_cell_kept(models, tmp_path, capsys):
    out = tmp_path / "o"
    assert _ruler(models["u1"], out) == 0
    before = _bytes(out)
    capsys.readouterr()
    for model, extra, difference in [
        ("u0", (), f"model: '{models['u1']}' -> '{models['u0']}'"),
        ("u1", ("--seed", "1"), "protocol.seed: 0 -> 1"),
        ("u1", ("--samples", "2"), "protocol.samples: 1 -> 2"),  # the last --samples wins
    ]:
        assert _ruler(models[model], out, *extra) == 2
        err = capsys.readouterr().err
        assert f"results folder '{out}' holds {CELL}, measured with a different {difference}; give another" in err
        assert _bytes(out) == before  # nothing replaced, the report neither
    assert _ruler(models["u1"], out) == 0 and _bytes(out) == before  # the same run again: reused


def test_new_weights_in_the_same_model_folder_are_refused(models, tmp_path, capsys):
    model = tmp_path / "m"
    shutil.copytree(models["u0"], model)
    out = tmp_path / "o"
    assert _ruler(str(model), out) == 0
    before = _bytes(out)
    shutil.copy(Path(models["u1"]) / "model.safetensors", model / "model.safetensors")
    capsys.readouterr()
    assert _ruler(str(model), out) == 2
    err = capsys.readouterr().err
    assert f"holds {CELL}, measured with a different model content: '{model}' had fingerprint" in err
    # another scaling of the same name is refused too: the report would compare two models' cells
    assert _ruler(str(model), out, "--method", "yarn", "--factor", "2") == 2
    assert "a different model content" in capsys.readouterr().err
    assert _bytes(out) == before


@pytest.mark.parametrize("which", ["cell", "results"])
def test_a_newer_ruler_schema_is_refused_and_left_as_it_is(models, tmp_path, capsys, which):
    out = tmp_path / "o"
    assert _ruler(models["u0"], out) == 0
    path = out / "cells" / CELL if which == "cell" else out / "results.json"
    data = json.loads(path.read_text())
    data.update(schema=data.get("schema", "ropescale.suite.cell/1")[:-1] + "2", added_later=1)
    path.write_text(json.dumps(data))
    before = _bytes(out)
    capsys.readouterr()
    assert _ruler(models["u0"], out) == 2
    what = "cell file" if which == "cell" else "results file"
    verb = "reads" if which == "cell" else "writes"  # a suite cell names no schema: a newer one is read by none
    assert f"{what} '{path}' has schema '{data['schema']}'; this ropescale {verb}" in capsys.readouterr().err
    assert _bytes(out) == before


def test_a_perplexity_folder_is_refused_by_eval_ruler(models, tmp_path, capsys):
    from ropescale.evals.suite.parse import suite_from_dict
    from ropescale.evals.suite.runner import run_suite

    data = tmp_path / "doc.txt"
    data.write_text("The quick brown fox jumps over the lazy dog. " * 200)
    raw = {"model": models["u0"], "device": "cpu", "data": str(data), "methods": ["none"]}
    out = tmp_path / "ppl"
    run_suite(suite_from_dict({**raw, "perplexity": {"lengths": [64]}}), out, progress=False)
    before = _bytes(out)
    assert _ruler(models["u0"], out) == 2
    err = capsys.readouterr().err
    assert f"results folder '{out}' holds another task's results.json (schema 'ropescale.results/2'); " in err
    assert "ropescale eval ruler writes its own there: give another --output" in err
    assert _bytes(out) == before


@pytest.fixture
def no_prompt_floor(monkeypatch):
    """Without the smallest-prompt refusal (``tasks.check_fits``), which now stops most lengths where lm-eval
    would fill a cell short: what is left of that case (random keys that vary a few tokens) is made here at
    a length below the floor, so the short-cell refusal behind it stays tested."""
    from ropescale.evals.tasks.ruler import tasks

    monkeypatch.setattr(tasks, "check_fits", lambda *args, **kwargs: None)


def _short_length(tok, samples: int) -> int:
    """A length at which lm-eval's niah_multikey_2 generator fits some but not all samples."""
    from ropescale.evals.tasks.ruler.tasks import TASKS, generate_samples

    for n in range(200, 320, 2):
        try:
            found = len(generate_samples(TASKS["niah_multikey_2"], tok, n, samples, 0))
        except Exception:  # noqa: BLE001 - none fits at all: lm-eval raises
            continue
        if 0 < found < samples:
            return n
    pytest.fail("no length fits some but not all samples with this tokenizer")


@pytest.mark.usefixtures("no_prompt_floor")
def test_a_cell_lm_eval_fills_short_is_refused_before_the_weights_load(models, tmp_path, capsys, monkeypatch):
    from transformers import AutoTokenizer

    import ropescale.models.loading as loading

    n = _short_length(AutoTokenizer.from_pretrained(models["u0"]), 6)
    monkeypatch.setattr(loading, "from_pretrained", lambda *a, **k: pytest.fail("weights loaded"))
    argv = ["eval", "ruler", "--model", models["u0"], "--method", "none", "--tasks", "niah_multikey_2"]
    out = tmp_path / "o"
    assert main([*argv, "--lengths", str(n), "--samples", "6", "--device", "cpu", "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"RULER task niah_multikey_2 at {n} tokens: lm-eval's generator fits " in err
    assert "of the 6 samples asked with this tokenizer" in err and "use a longer length" in err
    assert not (out / "cells").exists()


def _shipped(name: str) -> Path:
    from ropescale.evals.advice.battery_evidence import BATTERY_DIR

    return BATTERY_DIR / "smollm2-135m-x4-cpu" / name


class _Runtime:
    """The runtime the shipped cells were computed on (a CPU with AMX, bf16)."""

    def to_dict(self):
        return {"device": "cpu", "dtype": "bfloat16", "kernels": "amx", "attention": "sdpa"}


def _shipped_run(cells: Path, task: str, length: int, **kw):
    from ruler_run import RulerRun  # the earlier layout's runner, kept for the experiment drivers (benchmarks/)

    from ropescale.evals.tasks.ruler.record import Scaling
    from ropescale.evals.tasks.ruler.tasks import get_task

    run = RulerRun("smollm2-135m", Scaling("none"), [get_task(task)], [length], 30, cells, runtime=_Runtime(), **kw)
    run.__dict__["model_content"] = "a92fe8c8ef37"  # whatever its content now: the shipped cell could not record it
    return run


@pytest.mark.parametrize(
    ("name", "task", "length", "essay"),
    [
        ("none__niah_single_1__4096.json", "niah_single_1", 4096, False),
        ("none__niah_single_2-austen-__4096.json", "niah_single_2[austen]", 4096, True),
    ],
)
def test_a_shipped_cell_counts_as_done_under_the_new_keys(tmp_path, name, task, length, essay):
    (tmp_path / "cells").mkdir()
    shutil.copy(_shipped(name), tmp_path / "cells" / name)
    run = _shipped_run(tmp_path, task, length, essay_text="Emma Woodhouse, handsome." if essay else None)
    assert run.path(task, length).name == name  # today's file name: found where it is
    run.check()  # nothing to refuse
    assert run.is_done(task, length) and run.pending() == []
    other = _shipped_run(tmp_path, task, length, seed=1)
    assert not other.is_done(task, length)
    with pytest.raises(Exception, match="protocol.seed: 0 -> 1"):
        other.check()


def test_a_cell_stored_short_is_never_counted_done_and_the_report_says_it(tmp_path):
    from ropescale.evals.tasks.ruler.record import CellRecord
    from ropescale.evals.tasks.ruler.report import markdown, summarize

    name = "none__niah_single_1__4096.json"
    data = json.loads(_shipped(name).read_text())
    data["cell"]["records"] = data["cell"]["records"][:1]
    data["cell"]["samples"] = 1  # as a cell lm-eval filled short was stored before it was refused
    (tmp_path / "cells").mkdir()
    (tmp_path / "cells" / name).write_text(json.dumps(data))
    run = _shipped_run(tmp_path, "niah_single_1", 4096)
    assert not run.is_done("niah_single_1", 4096)
    record = CellRecord.from_json(data)
    assert record.short and not record.complete
    assert "n=1 of 30 asked (short)" in markdown(summarize([record]))


def test_a_journal_written_under_todays_keys_resumes(models, tmp_path, monkeypatch):
    """A cell interrupted under today's keys (its journal's fingerprint holds neither the model's content
    nor the haystack) resumes at its first undecoded prompt under the new ones, not set aside."""
    out = tmp_path / "o"
    _cut_after_the_first_prompt(monkeypatch)
    assert _ruler(models["u0"], out, "--samples", "2") == 130
    (journal,) = (out / "cells").glob("*.partial.jsonl")
    lines = journal.read_text().splitlines()
    head = json.loads(lines[0])
    head["fingerprint"] = {k: v for k, v in head["fingerprint"].items() if k not in ("model_content", "haystack")}
    journal.write_text("\n".join([json.dumps(head, sort_keys=True), *lines[1:]]) + "\n")  # as today's code wrote it

    decoded = _count_decoded(monkeypatch)
    assert _ruler(models["u0"], out, "--samples", "2") == 0
    assert len(decoded) == 1  # the first prompt came from the journal
    assert not list((out / "cells").glob("*.stale")) and (out / "cells" / CELL).is_file()


@pytest.mark.parametrize("header", ["today's", "before content keys"])
def test_a_cell_in_progress_resumes_with_its_model_moved(models, tmp_path, monkeypatch, header):
    """A prompt journal is keyed by the model's content, not its path: a RULER cell cut short resumes at its
    first undecoded prompt when the checkout (here the model folder) has moved since, and so does a journal
    whose header still names the path (as ropescale wrote them before) when the model is where it was."""
    first, moved = tmp_path / "a" / "m", tmp_path / "b" / "m"
    shutil.copytree(models["u0"], first)
    out = tmp_path / "o"
    _cut_after_the_first_prompt(monkeypatch)
    assert _ruler(str(first), out, "--samples", "2") == 130
    (journal,) = (out / "cells").glob("*.partial.jsonl")
    lines = journal.read_text().splitlines()
    head = json.loads(lines[0])
    assert str(tmp_path) not in lines[0]  # no path in the key
    if header != "today's":
        fp = head["fingerprint"]
        fp["model"] = str(first)
        fp["measured"]["model"] = {"name": str(first), **fp["measured"]["model"]}
        journal.write_text("\n".join([json.dumps(head, sort_keys=True), *lines[1:]]) + "\n")
    else:
        first.parent.rename(moved.parent)
    decoded = _count_decoded(monkeypatch)
    assert _ruler(str(moved if header == "today's" else first), out, "--samples", "2") == 0
    assert len(decoded) == 1  # the first prompt came from the journal
    assert not list((out / "cells").glob("*.stale")) and (out / "cells" / CELL).is_file()


def test_the_drivers_ruler_cell_in_progress_resumes_with_its_model_moved(models, tmp_path, monkeypatch):
    """The experiment drivers' runner (benchmarks/ruler_run.py, one file per task) keys its prompt journals
    by the model's content too: a checkout at another root resumes a cell at its first undecoded prompt."""
    from ruler_run import RulerRun

    from ropescale.evals.tasks.ruler.tasks import get_task
    from ropescale.models.runtime import resolve_runtime
    from ropescale.scaling import Scaling

    first, moved = tmp_path / "a" / "m", tmp_path / "b" / "m"
    shutil.copytree(models["u0"], first)
    out = tmp_path / "o"

    def run_of(model: Path) -> RulerRun:
        task = [get_task("niah_single_1")]
        return RulerRun(str(model), Scaling("none"), task, [256], 2, out, 0, resolve_runtime("cpu"), None, False)

    _cut_after_the_first_prompt(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        run_of(first).run()
    (journal,) = (out / "cells").glob("*.partial.jsonl")
    assert str(tmp_path) not in journal.read_text().splitlines()[0]  # no path in its key
    first.parent.rename(moved.parent)
    decoded = _count_decoded(monkeypatch)
    run_of(moved).run()
    assert len(decoded) == 1  # the first prompt came from the journal
    assert not list((out / "cells").glob("*.stale")) and (out / "cells" / "none__niah_single_1__256.json").is_file()


def test_a_cell_in_progress_of_the_earlier_layout_resumes_through_the_suite_runner(models, tmp_path, monkeypatch):
    """A RULER cell cut short under ``eval ruler``'s earlier layout (issue 53: its own runner, one journal per
    task): the suite runner now running ``eval ruler`` resumes at its first undecoded prompt, the old
    journal carried into the suite cell's and left as it was."""
    from ruler_run import RulerRun  # the earlier layout's runner, kept for the experiment drivers (benchmarks/)

    from ropescale.evals.tasks.ruler.tasks import get_task
    from ropescale.models.runtime import resolve_runtime
    from ropescale.scaling import Scaling

    out = tmp_path / "o"
    _cut_after_the_first_prompt(monkeypatch)
    run = RulerRun(
        models["u0"],
        Scaling("none"),
        [get_task("niah_single_1")],
        [256],
        2,
        out,
        0,
        resolve_runtime("cpu"),
        None,
        False,
    )
    with pytest.raises(KeyboardInterrupt):
        run.run()
    (journal,) = (out / "cells").glob("*.partial.jsonl")
    assert journal.name == "none__niah_single_1__256.partial.jsonl"  # the earlier layout's
    before = journal.read_bytes()
    decoded = _count_decoded(monkeypatch)
    assert _ruler(models["u0"], out, "--samples", "2") == 0
    assert len(decoded) == 1  # the first prompt came from the earlier journal
    assert (out / "cells" / CELL).is_file() and journal.read_bytes() == before


# ---- eval longppl --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def longppl_model(tmp_path_factory, bytelevel_tokenizer):
    path = tmp_path_factory.mktemp("lp") / "m"
    tiny_model(vocab_size=len(bytelevel_tokenizer), max_position_embeddings=512).save_pretrained(path)
    bytelevel_tokenizer.save_pretrained(path)
    return path


def _texts(tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("The quick brown fox jumps over the lazy dog. A cat sat on the mat. " * 40)
    b.write_text("Rain fell on the quiet town while the river ran high under the bridge. " * 40)
    return a, b


def _longppl(model: Path, data: Path, out: Path) -> int:
    argv = ["eval", "longppl", "--model", str(model), "--methods", "none", "--lengths", "160", "--data", str(data)]
    return main([*argv, "--trunc-len", "64", "--internal", "32", "--device", "cpu", "--output", str(out)])


def test_longppl_other_data_or_weights_are_refused_not_reused(longppl_model, tmp_path, capsys):
    a, b = _texts(tmp_path)
    out = tmp_path / "o"
    assert _longppl(longppl_model, a, out) == 0
    cell = out / "cells" / "none__longppl__160.json"
    before = cell.read_bytes()
    assert _longppl(longppl_model, a, out) == 0 and cell.read_bytes() == before  # the same run: reused
    capsys.readouterr()
    assert _longppl(longppl_model, b, out) == 2
    err = capsys.readouterr().err
    assert f"holds none__longppl__160.json, measured with a different data: '{a}' -> '{b}'; give another" in err
    a.write_text("Rain fell on the quiet town while the river ran high under the bridge. " * 40)  # edited in place
    assert _longppl(longppl_model, a, out) == 2
    assert f"a different data content: '{a}' had fingerprint" in capsys.readouterr().err
    model = tmp_path / "m2"
    shutil.copytree(longppl_model, model)
    assert _longppl(model, b, tmp_path / "o2") == 0
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]  # the tokenizer's, as before
    tiny_model(seed=3, vocab_size=vocab, max_position_embeddings=512).save_pretrained(model)  # new weights
    assert _longppl(model, b, tmp_path / "o2") == 2
    assert "a different model content" in capsys.readouterr().err
    assert cell.read_bytes() == before


def test_longppl_cell_of_today_counts_as_done(longppl_model, tmp_path, capsys):
    """A cell as ``eval longppl`` wrote it before it ran through the suite runner (issue 53: its own
    ``ropescale.longppl.cell/1`` layout, at the same file name), and before cells recorded the model's
    content and the data (issue 52): read as done, never replaced; one that measured other data is refused."""
    a, b = _texts(tmp_path)
    out = tmp_path / "o"
    assert _longppl(longppl_model, a, out) == 0
    cell = out / "cells" / "none__longppl__160.json"
    (data,) = json.loads((out / "results.json").read_text())["cells"]  # the cell, in the earlier layout's shape
    data["schema"] = "ropescale.longppl.cell/1"
    for key in ("model_content", "data"):  # as the runner before issue 52 wrote its cells
        del data["fingerprint"][key]
    cell.write_text(json.dumps(data))
    before = cell.read_bytes()
    assert _longppl(longppl_model, a, out) == 0 and cell.read_bytes() == before
    report = (out / "report.md").read_text()
    assert "| none      | 160      |" in report  # reported as before
    data["fingerprint"]["documents"] = 2  # measured otherwise: refused naming it, left as it is
    cell.write_text(json.dumps(data))
    before = cell.read_bytes()
    capsys.readouterr()
    assert _longppl(longppl_model, a, out) == 2
    assert (
        "holds none__longppl__160.json, measured with a different protocol.documents: 2 -> 1" in capsys.readouterr().err
    )
    assert cell.read_bytes() == before


def test_longppl_takes_the_folders_lock(longppl_model, tmp_path, capsys):
    from ropescale._lock import output_lock

    a, _ = _texts(tmp_path)
    out = tmp_path / "o"
    with output_lock(out, "results folder"):
        assert _longppl(longppl_model, a, out) == 2
    assert f"results folder '{out}' is being written by another ropescale" in capsys.readouterr().err
    assert not (out / "cells").exists()


@pytest.mark.parametrize("which", ["cell", "results", "ruler"])
def test_longppl_leaves_a_newer_schema_or_another_tasks_folder_as_it_is(longppl_model, tmp_path, capsys, which):
    a, _ = _texts(tmp_path)
    out = tmp_path / "o"
    assert _longppl(longppl_model, a, out) == 0
    path = out / "cells" / "none__longppl__160.json" if which == "cell" else out / "results.json"
    data = json.loads(path.read_text())
    data["schema"] = {"cell": "ropescale.longppl.cell/2", "results": "ropescale.longppl.results/2"}.get(
        which, "ropescale.ruler.results/1"
    )
    path.write_text(json.dumps(data))
    before = _bytes(out)
    capsys.readouterr()
    assert _longppl(longppl_model, a, out) == 2
    err = capsys.readouterr().err
    if which == "ruler":
        assert "holds another task's results.json (schema 'ropescale.ruler.results/1'); ropescale eval longppl" in err
    else:  # a suite cell names no schema: one that names one is read by no ropescale here
        assert (
            f"'{path}' has schema '{data['schema']}'; this ropescale {'reads' if which == 'cell' else 'writes'}" in err
        )
    assert _bytes(out) == before


@pytest.mark.usefixtures("no_prompt_floor")
def test_a_suite_ruler_cell_lm_eval_fills_short_is_refused_before_it_decodes(models):
    from transformers import AutoTokenizer

    from ropescale.evals.tasks.ruler.cell import run_ruler_cell
    from ropescale.evals.tasks.ruler.tasks import TASKS

    tok = AutoTokenizer.from_pretrained(models["u0"])
    n = _short_length(tok, 6)
    with pytest.raises(ValueError, match=f"niah_multikey_2 at {n} tokens: lm-eval's generator fits .* of the 6"):
        run_ruler_cell(None, tok, TASKS["niah_multikey_2"], n, 6)  # no model touched: refused before decoding


@pytest.mark.parametrize("schema", ["ropescale.results/9", "ropescale.ruler.results/1"])
def test_a_suite_leaves_a_newer_or_another_tasks_results_json_as_it_is(models, tmp_path, schema):
    """The suite runner's own report (run, and ``--report-only``) refuses the same files."""
    from ropescale.errors import RopescaleError
    from ropescale.evals.suite.parse import suite_from_dict
    from ropescale.evals.suite.runner import SuiteRunner

    data = tmp_path / "doc.txt"
    data.write_text("The quick brown fox jumps over the lazy dog. " * 200)
    raw = {"model": models["u0"], "device": "cpu", "data": str(data), "methods": ["none"]}
    suite = suite_from_dict({**raw, "perplexity": {"lengths": [64]}})
    out = tmp_path / "ppl"
    SuiteRunner(suite, out, progress=False).run()
    results = out / "results.json"
    results.write_text(json.dumps({**json.loads(results.read_text()), "schema": schema, "added_later": 1}))
    before = _bytes(out)
    why = "has schema 'ropescale.results/9'; this ropescale writes" if schema.endswith("/9") else "another task's"
    for call in (SuiteRunner(suite, out, progress=False).run, SuiteRunner(suite, out, progress=False).report):
        with pytest.raises(RopescaleError, match=why):
            call()
        assert _bytes(out) == before
