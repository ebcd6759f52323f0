"""One writer per output (:mod:`ropescale._lock`): a second writer stops naming the folder and the
holder; a writer that was killed never blocks the next one (the kernel drops its lock), which says so
and removes its staging left-overs. Every holder here is a real second process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ropescale._io import helper_path
from ropescale._lock import OutputLockedError, acquire, holder_path, lock_path, release
from ropescale.cli.main import main
from tests.conftest import tiny_model

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.getcwd()}
HOLD = "import sys, time; from ropescale._lock import acquire; acquire(sys.argv[1]); print('held', flush=True); time.sleep(120)"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("lock") / "tiny"
    tiny_model().save_pretrained(path)
    return path


@pytest.fixture
def holder():
    """Start a process that holds the lock of a path; yields a starter returning the process."""
    procs = []

    def start(path):
        proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], env=ENV, stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "held"
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def _cli(capsys, *argv):
    capsys.readouterr()
    code = main([str(a) for a in argv])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip() and "%|" not in line]
    return code, err


def test_lock_names_its_holder_and_is_released(tmp_path):
    out = tmp_path / "out"
    lock = acquire(out)
    record = json.loads(holder_path(out).read_text())
    assert record["pid"] == os.getpid() and record["host"] and record["started"]
    with pytest.raises(
        OutputLockedError, match=f"output '{out}' is being written by another ropescale .pid {os.getpid()}"
    ):
        acquire(out)
    release(lock)
    assert not lock.exists() and not holder_path(out).exists() and not out.exists()
    release(acquire(out))


@pytest.mark.parametrize(
    "command",
    [
        lambda m, out: ["patch", "--model", m, "--factor", "4", "--output", out],
        lambda m, out: ["export-gguf", m, "--output", out],
        lambda m, out: ["eval", "perplexity", "--model", m, "--lengths", "32", "--output", out],
        lambda m, out: ["eval", "harness", "--model", m, "--method", "none", "--tasks", "x", "--output", out],
        lambda m, out: ["search", "--model", m, "--target-length", "256", "--output", out],
    ],
    ids=["patch", "export-gguf", "eval", "eval harness", "search"],
)
def test_second_writer_stops_naming_the_holder(saved, tmp_path, capsys, holder, command):
    out = tmp_path / "out"
    proc = holder(out)
    code, err = _cli(capsys, *command(str(saved), str(out)))
    assert code == 2 and len(err) == 1, err
    assert f"'{out}' is being written by another ropescale (pid {proc.pid} on " in err[0], err
    assert not out.exists()


def test_a_killed_writer_never_blocks_and_its_left_overs_are_removed(saved, tmp_path, capsys, holder):
    out = tmp_path / "out"
    proc = holder(out)
    partial = helper_path(out, "partial", pid=proc.pid)  # what a killed atomic_directory leaves
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"x" * 100)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    code, err = _cli(capsys, "patch", "--model", saved, "--factor", "4", "--output", out)
    assert code == 0, err
    assert any(f"taking over the lock of output '{out}' left by pid {proc.pid}" in line for line in err), err
    assert any(f"removing {partial}" in line for line in err), err
    assert not partial.exists() and (out / "config.json").is_file()
    assert not lock_path(out).exists() and not holder_path(out).exists()


# A writer that holds the lock of argv[1] and stages inside atomic_directory, then waits (SIGTERM stops it).
STAGE = (
    "import sys, time; from ropescale._lock import acquire; from ropescale._io import atomic_directory; "
    "acquire(sys.argv[1]); cm = atomic_directory(sys.argv[1]); tmp = cm.__enter__(); "
    "(tmp / 'model.safetensors').write_bytes(b'x' * 100); print(tmp, flush=True); time.sleep(120)"
)
# A GGUF writer of argv[1] with its staging file open (export_gguf's _write), waiting.
GGUF = (
    "import sys, time; from pathlib import Path; from ropescale._io import _create_sibling; "
    "fd, tmp = _create_sibling(Path(sys.argv[1])); print(tmp, flush=True); time.sleep(120)"
)


def test_a_writer_never_removes_a_sibling_outputs_live_staging(saved, tmp_path, capsys):
    """patch --output tx beside a live export-gguf --output tx.gguf (and a SIGTERM'd writer of tx):
    the patch removes the stopped writer's staging of tx, never the GGUF's live one."""
    out, gguf = tmp_path / "tx", tmp_path / "tx.gguf"
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(path)], env=ENV, stdout=subprocess.PIPE, text=True)
        for code, path in ((STAGE, out), (GGUF, gguf))
    ]
    try:
        stopped_staging, live_staging = (Path(p.stdout.readline().strip()) for p in procs)
        assert stopped_staging.is_dir() and live_staging.is_file()
        procs[0].send_signal(signal.SIGTERM)
        procs[0].wait()
        code, err = _cli(capsys, "patch", "--model", saved, "--factor", "4", "--output", out)
        assert code == 0, err
        assert live_staging.is_file(), err  # the GGUF writer is still writing it
        assert not stopped_staging.exists()
        assert [line for line in err if "removing" in line] == [
            f"ropescale: removing {stopped_staging}, left by a writer of '{out}' that was stopped"
        ]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_a_240_character_output_name_is_written(saved, tmp_path, capsys):
    """Helper names (lock, staging, backup) stay within the 255-byte limit for a legal long name."""
    out = tmp_path / ("m" * 240)
    for extra in ([], ["--overwrite"]):
        code, err = _cli(capsys, "patch", "--model", saved, "--factor", "4", "--output", out, *extra)
        assert code == 0, err
    assert (out / "config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]  # no helper left
    assert all(len(os.fsencode(helper_path(out, k).name)) <= 255 for k in ("tmp", "partial", "old", "new"))
    assert len(lock_path(out).name) <= 255


def test_two_patch_processes_at_once_one_writes(saved, tmp_path):
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "ropescale.cli.main", "patch", "--model", str(saved), "--factor", "4"]
    procs = [
        subprocess.Popen(
            [*argv, "--output", str(out)], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    loser = next(err for code, err in results if code == 2)
    assert "is being written by another ropescale" in loser or "is not empty" in loser, loser
    assert (out / "config.json").is_file() and not list(tmp_path.glob(".out.*"))


def test_export_gguf_to_a_directory_is_refused_up_front(saved, tmp_path, capsys, monkeypatch):
    import ropescale.export.gguf as gguf_export

    monkeypatch.setattr(gguf_export, "_resolve", lambda *a, **k: pytest.fail("the model was read"))
    target = tmp_path / "dir"
    target.mkdir()
    code, err = _cli(capsys, "export-gguf", saved, "--output", target, "--overwrite")
    assert code == 2 and err == [f"ropescale: error: --output '{target}' is a directory; give the .gguf file to write"]


def test_a_note_without_a_live_lock_never_blocks(tmp_path):
    """The kernel's lock decides, not the note: one left naming a process on another host (whose lock
    its kernel dropped) is replaced, with the notice."""
    out = tmp_path / "out"
    holder_path(out).write_text(json.dumps({"pid": 1, "host": "elsewhere", "started": "now"}))
    release(acquire(out))
    assert not holder_path(out).exists()


# Holds the OS lock of argv[1] without writing the note (a process it forked, say), then waits.
BARE = (
    "import sys, time; from filelock import FileLock; from ropescale._lock import lock_path; "
    "held = FileLock(lock_path(sys.argv[1])); held.acquire(); print('held', flush=True); time.sleep(120)"
)


def test_a_holder_that_named_no_one_still_stops_the_second_writer(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-c", BARE, str(out)], env=ENV, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(OutputLockedError, match=f"^output '{out}' is being written by another ropescale; wait"):
            acquire(out)
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize(
    "command, what",
    [
        (lambda m, out: ["eval", "perplexity", "--model", m, "--lengths", "32", "--output", out], "results folder"),
        (lambda m, out: ["search", "--model", m, "--target-length", "256", "--output", out], "results folder"),
    ],
    ids=["eval", "search"],
)
def test_output_folder_that_is_a_file_is_refused(saved, tmp_path, capsys, command, what):
    out = tmp_path / "file"
    out.write_text("keep me")
    code, err = _cli(capsys, *command(str(saved), str(out)))
    assert code == 2 and err == [f"ropescale: error: {what} '{out}' exists and is a file, not a folder; choose another"]
    assert out.read_text() == "keep me"


@pytest.mark.parametrize("helper", [lock_path, holder_path], ids=["lock", "holder"])
def test_a_folder_where_the_lock_goes_is_named_not_opened(saved, tmp_path, capsys, helper):
    """``.<name>.lock`` (or ``.holder``) that is a folder, not made by ropescale: one line naming it,
    before the model is read, and the folder is left as it was (before: ``IsADirectoryError``, exit 1)."""
    out = tmp_path / "res"
    (helper(out) / "keep").mkdir(parents=True)
    code, err = _cli(capsys, "eval", "perplexity", "--model", saved, "--lengths", "32", "--output", out)
    assert code == 2 and err == [
        f"ropescale: error: cannot lock results folder '{out}': '{helper(out)}' is a folder, where ropescale keeps "
        f"that output's {'lock' if helper is lock_path else 'lock holder'} file; remove it (ropescale did not "
        "write it) or choose another output"
    ], err
    assert (helper(out) / "keep").is_dir() and sorted(os.listdir(tmp_path)) == [helper(out).name]
