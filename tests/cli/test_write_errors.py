"""Off-contract errors become one ``ropescale: error:`` line naming the user's file, exit 2: a full disk
or a read-only folder while writing an output (never an internal staging or lock name, never a
numpy short-write count), an unwritable ROPESCALE_CACHE before the model is converted, a truncated cell
file under ``--report-only``. The disks are real where the machine allows a private mount namespace
(``unshare -m``, as root), and a monkeypatched OSError otherwise (those tests always run)."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ropescale.cli.main import main
from tests.cli.test_patch_cli import assert_one_line_error, run
from tests.evals.test_cell_keys import _eval, models  # noqa: F401 (a fixture)
from tests.export.conftest import tiny_llama, tiny_tokenizer

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.getcwd()}


def _namespaces() -> bool:
    if shutil.which("unshare") is None or os.geteuid() != 0:
        return False
    done = subprocess.run(["unshare", "-m", "true"], capture_output=True, check=False)
    return done.returncode == 0


needs_namespace = pytest.mark.skipif(not _namespaces(), reason="no private mount namespace here (unshare -m as root)")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("write") / "tiny"
    tiny_llama().save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


def _in_tmpfs(mount: Path, options: str, *argv: str, then_ro: bool = False) -> subprocess.CompletedProcess:
    """Run ``ropescale argv`` in a private mount namespace with a small tmpfs at ``mount``."""
    mount.mkdir(parents=True, exist_ok=True)
    ro = f" && mount -o remount,ro {mount}" if then_ro else ""
    script = f'mount -t tmpfs -o {options} tmpfs {mount}{ro} && exec "$@"'
    cmd = ["unshare", "-m", "sh", "-c", script, "sh", sys.executable, "-m", "ropescale.cli.main", *argv]
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, check=False, timeout=300)


def _lines(err: str) -> list[str]:
    return [ln for ln in err.replace("\r", "\n").splitlines() if ln.strip() and "%|" not in ln]


@needs_namespace
def test_export_gguf_on_a_full_disk_names_the_output(checkpoint, tmp_path):
    mount = tmp_path / "small"
    out = mount / "tx.gguf"
    done = _in_tmpfs(mount, "size=64k", "export-gguf", str(checkpoint), "--output", str(out), "--dtype", "f32")
    assert done.returncode == 2 and _lines(done.stderr) == [
        f"ropescale: error: cannot write output '{out}': no space left on the device (in '{mount}')"
    ], done.stderr


@needs_namespace
def test_patch_on_a_full_disk_names_the_output(checkpoint, tmp_path):
    """safetensors reports the full disk as its own error ("... (os error 28)"), in a staging folder."""
    mount = tmp_path / "small"
    out = mount / "p"
    done = _in_tmpfs(mount, "size=64k", "patch", "--model", str(checkpoint), "--factor", "2", "--output", str(out))
    assert done.returncode == 2 and _lines(done.stderr) == [
        f"ropescale: error: cannot write output '{out}': no space left on the device (in '{mount}')"
    ], done.stderr


def test_write_errors_name_the_output_and_leave_inputs_alone(tmp_path):
    from ropescale._io import helper_path
    from ropescale._lock import OutputWriteError, write_error, writing

    out = tmp_path / "out"
    staged = helper_path(out, "partial") / "model.safetensors"
    error = write_error(OSError(errno.ENOSPC, "No space left on device", str(staged)), out)
    assert str(error) == f"cannot write output '{out}': no space left on the device (in '{tmp_path}')"
    assert write_error(OSError(errno.EACCES, "Permission denied", str(tmp_path / "model")), out) is None  # an input
    assert write_error(OSError(errno.ENOENT, "No such file", str(staged)), out) is None  # not a refusal to write
    with pytest.raises(OutputWriteError, match="read-only"), writing(out):
        raise RuntimeError("Error while serializing: I/O error: Read-only file system (os error 30)")
    with pytest.raises(RuntimeError, match="deserializing"), writing(out):
        raise RuntimeError("Error while deserializing header: I/O error: Permission denied (os error 13)")


@needs_namespace
@pytest.mark.parametrize("command", ["export-gguf", "patch", "eval", "plot"])
def test_a_read_only_output_folder_is_named_not_a_lock_file(checkpoint, tmp_path, command):
    mount = tmp_path / "ro"
    out = mount / "res"
    argv = {
        "export-gguf": ["export-gguf", str(checkpoint), "--output", str(out)],
        "patch": ["patch", "--model", str(checkpoint), "--factor", "2", "--output", str(out)],
        "plot": ["plot", "--model", str(checkpoint), "--methods", "linear", "--factor", "2", "--output", str(out)],
        "eval": [
            "eval",
            "perplexity",
            "--model",
            str(checkpoint),
            "--lengths",
            "32",
            "--max-tokens",
            "64",
            "--data",
            str(checkpoint / "tokenizer.json"),
            "--output",
            str(out),
            "--no-progress",
        ],
    }[command]
    done = _in_tmpfs(mount, "size=64k", *argv, then_ro=True)
    lines = _lines(done.stderr)
    assert done.returncode == 2 and len(lines) == 1 and f"'{out}'" in lines[0], done.stderr
    assert ".lock" not in lines[0] and ".new" not in lines[0]
    assert "read-only" in lines[0] or "not writable" in lines[0], lines[0]


@needs_namespace
def test_a_read_only_cache_is_said_before_the_model_is_converted(tmp_path):
    cache = tmp_path / "cache"
    env_cache = {**ENV, "ROPESCALE_CACHE": str(cache)}
    cache.mkdir()
    cmd = [
        "unshare",
        "-m",
        "sh",
        "-c",
        f'mount -t tmpfs -o size=64k,ro tmpfs {cache} && exec "$@"',
        "sh",
        sys.executable,
        "-m",
        "ropescale.cli.main",
        "patch",
        "--model",
        "smollm2-135m",
        "--factor",
        "2",
        "--output",
        str(tmp_path / "o"),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env_cache, check=False, timeout=300)
    assert done.returncode == 2 and _lines(done.stderr) == [
        f"ropescale: error: ROPESCALE_CACHE '{cache}' is not writable (Read-only file system); point "
        "ROPESCALE_CACHE at a writable folder"
    ], done.stderr
    assert "converting" not in done.stdout


def test_a_short_write_during_export_gguf_names_the_output(checkpoint, tmp_path, capsys, monkeypatch):
    """numpy's tofile on a full disk raises OSError('N requested and M written') without an errno."""
    import gguf

    def full(self, *args, **kwargs):
        raise OSError("3145728 requested and 685552 written")

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensor_data", full)
    out = tmp_path / "tx.gguf"
    code, _, err = run(capsys, "export-gguf", str(checkpoint), "--output", str(out))
    assert_one_line_error(code, err, f"cannot write output '{out}': no space left on the device")
    assert code == 2 and "requested" not in err and sorted(os.listdir(tmp_path)) == []


def test_a_read_only_folder_while_taking_the_lock_names_the_output(checkpoint, tmp_path, capsys, monkeypatch):
    import ropescale._lock as lock

    class ReadOnly:  # filelock creating the lock file in a read-only folder
        def __init__(self, path, **kwargs):
            self.path = path

        def acquire(self):
            raise OSError(errno.EROFS, "Read-only file system", str(self.path))

    monkeypatch.setattr(lock, "FileLock", ReadOnly)
    out = tmp_path / "res.gguf"
    code, _, err = run(capsys, "export-gguf", str(checkpoint), "--output", str(out))
    assert_one_line_error(code, err, f"cannot write output '{out}': the file system is read-only")
    assert code == 2 and ".lock" not in err


def test_an_unwritable_cache_is_said_before_conversion(tmp_path, capsys, monkeypatch):
    import transformers

    from ropescale.models import embedded

    real = embedded.tempfile.TemporaryFile

    def refuse(*args, dir=None, **kwargs):
        if dir is not None and str(tmp_path / "cache") in str(dir):
            raise OSError(errno.EROFS, "Read-only file system")
        return real(*args, dir=dir, **kwargs)

    def never(*args, **kwargs):
        raise AssertionError("the model was converted before the cache was checked")

    monkeypatch.setenv("ROPESCALE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(embedded.tempfile, "TemporaryFile", refuse)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", never)
    code, _, err = run(capsys, "patch", "--model", "smollm2-135m", "--factor", "2", "--output", str(tmp_path / "o"))
    assert_one_line_error(code, err, f"ROPESCALE_CACHE '{tmp_path / 'cache'}' is not writable (Read-only file system)")


def test_a_truncated_cell_under_report_only_names_the_file(models, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "d"
    assert _eval(capsys, models, out) == (0, [])
    cell = sorted((out / "cells").glob("*.json"))[0]
    cell.write_text(cell.read_text()[:40])
    capsys.readouterr()
    code = main(["eval", "suite", str(out / "suite.yaml"), "--output", str(out), "--report-only"])
    err = capsys.readouterr().err
    assert_one_line_error(code, err, f"cell file '{cell}' is not valid JSON", "remove it and run the suite again")
    assert code == 2
