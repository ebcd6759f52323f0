"""A closed standard output is a failure, for every command: real processes whose stdout is a pipe
with no reader exit 141 (128 + SIGPIPE) and print no traceback (before: exit 0, nothing written)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import tiny_model


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("pipe") / "m"
    tiny_model().save_pretrained(path)
    return path


def _closed_stdout(*argv):
    read, write = os.pipe()
    os.close(read)  # no reader: the first write (or flush) gets EPIPE
    try:
        return subprocess.run(
            [sys.executable, "-m", "ropescale.cli.main", *map(str, argv)],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
        )
    finally:
        os.close(write)


@pytest.mark.parametrize(
    "argv",
    [
        ["methods"],
        ["--help"],
        ["--version"],
        ["patch", "--help"],
        ["doctor", "{model}"],
        ["patch", "--model", "{model}", "--method", "yarn", "--factor", "4"],
    ],
)
def test_broken_pipe_exits_non_zero(model, argv):
    done = _closed_stdout(*[a.format(model=model) for a in argv])
    assert done.returncode == 141, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr


def test_an_open_pipe_still_exits_0(model):
    done = subprocess.run(
        [sys.executable, "-m", "ropescale.cli.main", "methods"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and "yarn" in done.stdout, done.stderr
