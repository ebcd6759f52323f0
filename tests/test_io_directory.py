"""Replacing an output directory: an interruption at any point leaves the old or the new one at the path.

The portable path takes two renames (old away, new in); an interruption between them is simulated
by a ``KeyboardInterrupt`` from the second ``os.replace``. On Linux the swap is one
``renameat2(RENAME_EXCHANGE)``.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ropescale import _io
from ropescale._io import atomic_directory, recover_directory


def _filled(path, text: str):
    path.mkdir()
    (path / "f.txt").write_text(text)
    return path


def _interrupt_second_replace(monkeypatch):
    real, calls = os.replace, []

    def flaky(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(src, dst)

    monkeypatch.setattr(os, "replace", flaky)
    return calls


def test_interrupt_between_the_two_renames_is_recovered_by_the_next_call(tmp_path, monkeypatch):
    target = _filled(tmp_path / "out", "old")
    monkeypatch.setattr(_io, "_exchange", lambda a, b: False, raising=False)  # the portable path
    calls = _interrupt_second_replace(monkeypatch)
    with pytest.raises(KeyboardInterrupt), atomic_directory(target, overwrite=True) as tmp:
        (tmp / "f.txt").write_text("new")
    assert len(calls) == 2
    monkeypatch.undo()
    # the next run: whatever it does, the path holds a complete output again first
    with pytest.raises(RuntimeError), atomic_directory(target, overwrite=True) as tmp:
        raise RuntimeError("this run fails too")
    assert (target / "f.txt").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no backup or partial left


def test_readers_recover_a_missing_output(tmp_path, monkeypatch):
    target = _filled(tmp_path / "out", "old")
    monkeypatch.setattr(_io, "_exchange", lambda a, b: False, raising=False)
    _interrupt_second_replace(monkeypatch)
    with pytest.raises(KeyboardInterrupt), atomic_directory(target, overwrite=True) as tmp:
        (tmp / "f.txt").write_text("new")
    monkeypatch.undo()
    assert recover_directory(target) is True
    assert (target / "f.txt").read_text() == "old"
    assert recover_directory(target) is False  # nothing left to do


def test_a_stale_backup_beside_a_complete_output_is_removed(tmp_path):
    target = _filled(tmp_path / "out", "new")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    # the rename of the new one finished; the removal did not, and its writer is gone
    _filled(_io.helper_path(target, "old", pid=int(gone.stdout)), "old")
    with atomic_directory(target, overwrite=True) as tmp:
        (tmp / "f.txt").write_text("newer")
    assert (target / "f.txt").read_text() == "newer"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_replace_with_exchange_or_fallback_gives_the_new_output(tmp_path):
    target = _filled(tmp_path / "out", "old")
    with atomic_directory(target, overwrite=True) as tmp:
        (tmp / "f.txt").write_text("new")
    assert (target / "f.txt").read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


@pytest.mark.skipif(not os.uname().sysname == "Linux", reason="renameat2 is Linux's")
def test_exchange_swaps_two_directories_in_one_step(tmp_path):
    a, b = _filled(tmp_path / "a", "A"), _filled(tmp_path / "b", "B")
    if not _io._exchange(a, b):
        pytest.skip("this file system does not support RENAME_EXCHANGE")
    assert (a / "f.txt").read_text() == "B" and (b / "f.txt").read_text() == "A"
