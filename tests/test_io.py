"""Atomic writes: whole files only, the usual permissions, nothing left behind on failure."""

from __future__ import annotations

import os

import pytest

from ropescale import _io
from ropescale._io import atomic_write_bytes, atomic_write_json, atomic_write_text


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600)])
def test_files_get_the_umask_permissions(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        atomic_write_bytes(tmp_path / "a" / "b.bin", b"\x00\x01")
        atomic_write_text(tmp_path / "c.txt", "héllo\n")
        atomic_write_json(tmp_path / "d.json", {"x": 1})
        atomic_write_bytes(tmp_path / "a" / "b.bin", b"new")  # replacing keeps the rule
    finally:
        os.umask(old)
    assert (tmp_path / "a" / "b.bin").read_bytes() == b"new"
    assert (tmp_path / "c.txt").read_text(encoding="utf-8") == "héllo\n"
    for p in (tmp_path / "a" / "b.bin", tmp_path / "c.txt", tmp_path / "d.json"):
        assert p.stat().st_mode & 0o777 == mode
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a", "b.bin", "c.txt", "d.json"]


def test_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "f.bin"
    target.write_bytes(b"old")

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(_io.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["f.bin"]
    with pytest.raises(TypeError, match="data must be bytes"):
        atomic_write_bytes(target, "text")
