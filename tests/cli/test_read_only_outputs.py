"""Every command that takes an output lock, pointed at a read-only folder, says so in one line naming the
output as the user gave it (exit 2), never the lock file.

The case was fixed once (issue 42) and came back (issue 52): filelock 4 opens its lock file by its
absolute path, and the check compared that with a relative ``--output``, so ``rofs/res`` printed the raw
``OSError: [Errno 30] Read-only file system: '/abs/rofs/.res.lock'``. The old tests gave absolute
``tmp_path`` outputs only, and covered four of the commands. Here one driver runs each command in-process
on a relative output, twice: in a private read-only bind mount where the machine allows one (a real
kernel refusal), and always with the folder made read-only by a monkeypatched ``os.open``/``os.mkdir``
(what filelock, tempfile and the writers call first)."""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

FOLDER = "rofs"  # relative, as a user types it: the case the old tests missed
# each command that holds an output lock (ropescale._lock.output_lock), or writes under writing()
COMMANDS: dict[str, list[str]] = {
    "patch": ["patch", "--model", "m", "--factor", "2", "--output", f"{FOLDER}/res"],
    "export-gguf": ["export-gguf", "m", "--output", f"{FOLDER}/res.gguf"],
    "eval perplexity": [
        *("eval", "perplexity", "--model", "m", "--lengths", "32", "--max-tokens", "64"),
        *("--data", "text.txt", "--output", f"{FOLDER}/res", "--no-progress"),
    ],
    "eval passkey": ["eval", "passkey", "--model", "m", "--lengths", "64", "--output", f"{FOLDER}/res"],
    "eval needle": ["eval", "needle", "--model", "m", "--lengths", "64", "--output", f"{FOLDER}/res"],
    "eval harness": ["eval", "harness", "--model", "m", "--method", "none", "--tasks", "x", "--output", f"{FOLDER}/r"],
    "eval ruler": [
        "eval",
        "ruler",
        "--model",
        "m",
        "--tasks",
        "niah_single_1",
        "--lengths",
        "1k",
        "--output",
        f"{FOLDER}/res",
    ],
    "eval longppl": [
        *("eval", "longppl", "--model", "m", "--methods", "none", "--lengths", "200", "--data", "text.txt"),
        *("--trunc-len", "64", "--internal", "32", "--device", "cpu", "--output", f"{FOLDER}/res"),
    ],
    "search": ["search", "--model", "m", "--target-length", "256", "--output", f"{FOLDER}/res"],
    "train": ["train", "--config", "recipe.yaml", "--output-dir", f"{FOLDER}/run", "--no-progress"],
    "train export": ["export", "run", "--output", f"{FOLDER}/merged"],
    "plot": ["plot", "--model", "m", "--methods", "linear", "--factor", "2", "--output", f"{FOLDER}/res.png"],
}
OUTPUT_OF = {name: argv[-1] if argv[-1] != "--no-progress" else argv[-2] for name, argv in COMMANDS.items()}


def drive(workdir: str | os.PathLike) -> dict[str, tuple[int, list[str]]]:
    """Run every command of :data:`COMMANDS` in ``workdir``, in this process: ``{name: (exit code, stderr lines)}``."""
    from ropescale.cli.main import main

    os.chdir(workdir)
    found = {}
    for name, argv in COMMANDS.items():
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(list(argv))
        lines = [ln for ln in err.getvalue().replace("\r", "\n").splitlines() if ln.strip() and "%|" not in ln]
        found[name] = (code, lines)
    return found


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A tiny model ``m``, a text, a training recipe on them, and the empty folder ``rofs``."""
    from tests.export.conftest import tiny_llama, tiny_tokenizer

    path = tmp_path_factory.mktemp("ro")
    tiny_llama().save_pretrained(path / "m")
    tiny_tokenizer().save_pretrained(path / "m")
    (path / "text.txt").write_text("The cat sat on the mat and looked at the rain. " * 200)
    recipe = {
        "model": {"name": str(path / "m")},
        "scaling": {"method": "yarn", "factor": 4},
        "lora": {"r": 4, "alpha": 8},
        "data": {"source": str(path / "text.txt"), "seq_len": 32},
        "train": {"max_steps": 1, "gradient_checkpointing": False},
        "eval": {"every": 0, "at_end": False},
    }
    (path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    (path / FOLDER).mkdir()
    return path


def _check(found: dict[str, tuple[int, list[str]]], workdir: Path) -> None:
    bad = {}
    for name, (code, lines) in found.items():
        out = OUTPUT_OF[name]
        ok = code == 2 and len(lines) == 1 and f"'{out}'" in lines[0] and lines[0].startswith("ropescale: error: ")
        ok = ok and ".lock" not in lines[0] and "Errno" not in lines[0]
        ok = ok and ("read-only" in lines[0] or "not writable" in lines[0])
        if not ok:
            bad[name] = (code, lines[-3:])
    assert not bad, json.dumps(bad, indent=1)
    assert os.listdir(workdir / FOLDER) == []


def test_every_lock_taking_command_names_a_read_only_output(workdir, monkeypatch):
    """The folder refuses every write (os.open for writing, os.mkdir) with EROFS, naming the path as
    the system call got it, as the kernel does."""
    real_open, real_mkdir = os.open, os.mkdir
    ro = os.path.realpath(workdir / FOLDER)

    def inside(path) -> bool:
        if isinstance(path, int):
            return False
        full = os.path.realpath(os.fsdecode(path))
        return full == ro or full.startswith(ro + os.sep)

    def refusing_open(path, flags, *args, **kwargs):
        writes = flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC)
        if writes and kwargs.get("dir_fd") is None and inside(path):
            raise OSError(errno.EROFS, "Read-only file system", path)
        return real_open(path, flags, *args, **kwargs)

    def refusing_mkdir(path, *args, **kwargs):
        if inside(path):
            if os.path.exists(path):
                raise FileExistsError(errno.EEXIST, "File exists", path)
            raise OSError(errno.EROFS, "Read-only file system", path)
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing_open)
    monkeypatch.setattr(os, "mkdir", refusing_mkdir)
    cwd = os.getcwd()
    try:
        found = drive(workdir)
    finally:
        os.chdir(cwd)
    _check(found, workdir)


def _namespaces() -> bool:
    if shutil.which("unshare") is None:
        return False
    done = subprocess.run(["unshare", "-rm", "true"], capture_output=True, check=False)
    return done.returncode == 0


@pytest.mark.skipif(not _namespaces(), reason="no private mount namespace here (unshare -rm)")
def test_every_lock_taking_command_names_a_real_read_only_mount(workdir):
    """The same commands, in one process, in a mount namespace where ``rofs`` is a read-only bind mount."""
    script = (
        f"mount --bind {FOLDER} {FOLDER} && mount -o remount,ro,bind {FOLDER} && touch {FOLDER}/x 2>/dev/null; "
        f'test ! -e {FOLDER}/x && exec "$@"'
    )
    code = "import json, sys; from tests.cli.test_read_only_outputs import drive; print(json.dumps(drive(sys.argv[1])))"
    pythonpath = os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": pythonpath}
    cmd = ["unshare", "-rm", "sh", "-c", script, "sh", sys.executable, "-c", code, str(workdir)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=workdir, check=False, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    found = {k: tuple(v) for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}
    _check(found, workdir)
