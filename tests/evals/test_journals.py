"""benchmarks/journals.py: a run's prompt journals committed between sittings and put back, so a fresh
checkout resumes a RULER cell at its first undecoded prompt instead of starting it again."""

from __future__ import annotations

import pytest

from tests.conftest import load_script


@pytest.fixture(scope="module")
def journals():
    return load_script("benchmarks/journals.py", "journals")


def test_save_restore_and_retire_a_journal(journals, tmp_path):
    run, committed = tmp_path / "runs" / "r" / "cells", tmp_path / "repo" / "in-progress" / "r"
    run.mkdir(parents=True)
    suite = run / "yarn-x4__ruler__32768.niah_single_1.partial.jsonl"  # a suite cell's task journal
    earlier = run / "as-saved__niah_single_2__16384.partial.jsonl"  # one cell per task
    suite.write_text('{"fingerprint": 1}\n{"prompt": "a"}\n')
    earlier.write_text('{"fingerprint": 2}\n')
    (run / "x.partial.jsonl.stale").write_text("set aside\n")  # never committed
    written, removed = journals.save(run, committed)
    assert sorted(p.name for p in written) == sorted([suite.name, earlier.name]) and removed == []
    assert journals.save(run, committed) == ([], [])  # unchanged: nothing rewritten
    # a fresh checkout: the run's folder is gone, the committed journals come back
    fresh = tmp_path / "fresh" / "cells"
    assert sorted(p.name for p in journals.restore(committed, fresh)) == sorted([suite.name, earlier.name])
    assert (fresh / suite.name).read_text() == suite.read_text()
    # a journal in the run is never overwritten by an older committed copy
    (fresh / suite.name).write_text('{"fingerprint": 1}\n{"prompt": "a"}\n{"prompt": "b"}\n')
    assert journals.restore(committed, fresh) == []
    assert journals.save(fresh, committed)[0] == [committed / suite.name]
    assert (committed / suite.name).read_text().count("prompt") == 2
    # the cell is written (the runner removed its journal): the committed journal goes too
    (fresh / suite.name).unlink()
    (fresh / "yarn-x4__ruler__32768.json").write_text("{}")
    assert journals.save(fresh, committed) == ([], [committed / suite.name])
    assert journals.restore(committed, fresh) == []  # nor is it restored beside the written cell
    # a journal that vanished while its cell is not written stays committed (a folder not yet restored)
    (fresh / earlier.name).unlink()
    assert journals.save(fresh, committed) == ([], [])
    assert [p.name for p in journals.journals(committed)] == [earlier.name]


def test_the_command_line(journals, tmp_path, capsys):
    run = tmp_path / "run"
    (run / "cells").mkdir(parents=True)
    (run / "cells" / "a__ruler__4096.t.partial.jsonl").write_text("{}\n")
    assert journals.main(["save", str(run), str(tmp_path / "c")]) == 0
    assert "1 journals (1 written, 0 removed" in capsys.readouterr().out
    assert journals.main(["restore", str(tmp_path / "c"), str(tmp_path / "back")]) == 0
    assert (tmp_path / "back" / "cells" / "a__ruler__4096.t.partial.jsonl").is_file()
    assert journals.main(["restore", str(tmp_path / "nothing"), str(run)]) == 2
    assert capsys.readouterr().err.startswith("journals.py: ")
