"""One writer per output: an OS lock beside the output, and a note naming its holder.

``patch/export --output DIR``, ``export-gguf --output FILE``, ``train --output-dir DIR`` and
``eval ... --output DIR`` hold ``.<key>.lock`` beside their output while they write (``<key>``: the
output's name, or for a name above 200 bytes its start and a digest, see
:func:`ropescale._io.helper_key`). The lock is ``filelock``'s: an ``flock`` the kernel releases when its
holder exits or is killed, so a writer that died never blocks the next one and no takeover code is
needed. Beside it, ``.<key>.holder`` records the holder's pid, host, start time and command line,
so a second writer stops at once with a line naming the folder and the holder instead of both writing.

A note left by a killed writer is replaced with a one-line notice, and its staging files
(``.<key>.<owner>.partial`` folders, ``.tmp`` files, ``.old`` backups) are removed only when they
belong to exactly this output and their owner (host, pid and start time, in the name) is gone: a
sibling output's live staging file (``tx.gguf``'s beside ``tx``) never matches.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import socket
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TypedDict

from filelock import FileLock, Timeout

from ._io import (
    atomic_write_json,
    helper_key,
    helpers_of,
    overlapping_input,
    process_alive,
    process_start,
    recover_directory,
    remove_path,
)
from .errors import RopescaleError


class OutputLockedError(RopescaleError):
    """Another process is writing the same output."""


def lock_path(output: str | os.PathLike) -> Path:
    """The lock file of an output: ``.<key>.lock`` in the same folder (within the file-name limit)."""
    output = Path(output).expanduser()
    return output.with_name(f".{helper_key(output)}.lock")


def holder_path(output: str | os.PathLike) -> Path:
    """The note naming the lock's holder: ``.<key>.holder`` beside the output."""
    output = Path(output).expanduser()
    return output.with_name(f".{helper_key(output)}.holder")


_HELD: dict[Path, FileLock] = {}  # this process's locks, by lock file


class HolderNote(TypedDict, total=False):
    """``.<key>.holder``: who holds the lock (read back from a file another process may have left,
    damaged or half-written: every key may be missing)."""

    pid: int
    host: str
    started: str  # local time, for the message
    process_start: str | None  # :func:`ropescale._io.process_start`: tells a reused pid apart
    command: str  # the command line, cut to 300 characters


def _describe(holder: HolderNote) -> str:
    return f"pid {holder.get('pid')} on {holder.get('host')}, since {holder.get('started')}"


def _read(note: Path) -> HolderNote:
    try:
        data = json.loads(note.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _running(holder: HolderNote) -> bool:
    """The note names a process that may hold the lock (one on another host cannot be checked)."""
    pid = holder.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    return holder.get("host") != socket.gethostname() or process_alive(pid, holder.get("process_start"))


def acquire(output: str | os.PathLike, what: str = "output", folder: bool = True) -> Path:
    """Take the lock of ``output`` and write the note naming this process.

    Args:
        output: the folder or file about to be written.
        what: how to name it in the message (``output``, ``run folder``, ...).
        folder: ``output`` is a folder: an existing file there is refused first.

    Returns:
        The lock file (give it to :func:`release`).

    Raises:
        OutputLockedError: another process holds it: ``<what> '<output>' is being written by another
            ropescale (pid N on HOST, since TIME: COMMAND); wait for it or choose another``.
    """
    output = Path(output).expanduser()
    if folder and output.exists() and not output.is_dir():
        raise RopescaleError(f"{what} '{output}' exists and is a file, not a folder; choose another")
    path, note = lock_path(output), holder_path(output)
    for helper in (path, note):  # a folder there: filelock's open says only "[Errno 21] Is a directory"
        if helper.is_dir():
            raise RopescaleError(
                f"cannot lock {what} '{output}': '{helper}' is a folder, where ropescale keeps that output's "
                f"{'lock' if helper == path else 'lock holder'} file; remove it (ropescale did not write it) "
                "or choose another output"
            )
    path.parent.mkdir(parents=True, exist_ok=True)
    holder: HolderNote = {}
    for _ in range(40):  # the holder writes its note just after locking, and removes it just before unlocking
        lock = FileLock(path, timeout=0)
        try:
            lock.acquire()
        except Timeout:
            holder = _read(note)
            if _running(holder):
                break
            time.sleep(0.05)
            continue
        left = _read(note)
        if left.get("pid") is not None:
            print(
                f"ropescale: taking over the lock of {what} '{output}' left by {_describe(left)} "
                "(that process is gone)",
                file=sys.stderr,
            )
        _HELD[path] = lock
        try:
            mine: HolderNote = {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                "process_start": process_start(os.getpid()),
                "command": " ".join(sys.argv)[:300],
            }
            atomic_write_json(note, mine)
            _remove_leftovers(output)
        except BaseException:
            release(path)
            raise
        return path
    else:
        holder = {}  # locked, but its holder never named itself (a process forked by it, say)
    command = f": {holder['command']}" if holder.get("command") else ""
    who = f" ({_describe(holder)}{command})" if holder else ""
    raise OutputLockedError(
        f"{what} '{output}' is being written by another ropescale{who}; wait for it or choose another"
    )


def release(lock: Path) -> None:
    """Remove the lock file and the note, then unlock, if this process holds ``lock``. The file goes
    while still locked: a writer that opened it just before sees it unlinked and tries again
    (``filelock`` checks the link count after locking)."""
    held = _HELD.pop(Path(lock), None)
    if held is None:
        return
    try:
        Path(lock).with_suffix(".holder").unlink(missing_ok=True)
        Path(lock).unlink(missing_ok=True)
    finally:
        held.release()


@contextlib.contextmanager
def output_lock(
    output: str | os.PathLike, what: str = "output", enabled: bool = True, folder: bool = True
) -> Iterator[None]:
    """Hold the lock of ``output`` for the block (see :func:`acquire`); ``enabled=False`` does nothing
    (the ranks other than the main one of a distributed run). A full disk, a read-only folder or a
    refused permission while writing it is said naming ``output`` (:func:`writing`)."""
    with writing(output, what):
        lock = acquire(output, what, folder) if enabled else None
        try:
            yield
        finally:
            if lock is not None:
                release(lock)


class OutputWriteError(RopescaleError):
    """The system refused to write an output (full disk, read-only file system, no permission)."""


_WRITE_ERRORS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.ENAMETOOLONG: "a file name is too long for the file system",
}
_RUST_IO = re.compile(r"serializ\w*: I/O error: .*\(os error (\d+)\)")  # safetensors' save_file
_SHORT_WRITE = re.compile(r"\d+ requested and \d+ written")  # numpy's tofile on a full disk sets no errno


def write_error(exc: OSError, output: str | os.PathLike, what: str = "output") -> OutputWriteError | None:
    """The one-line error for ``exc`` raised while writing ``output``, or None when it is not a refusal
    to write there (another errno, or a file elsewhere: an input that cannot be read keeps its own
    message). Internal names (staging files, the lock) are never shown: the output is named."""
    code = exc.errno
    if code is None and _SHORT_WRITE.search(str(exc)):
        code = errno.ENOSPC
    if code not in _WRITE_ERRORS:
        return None
    # absolute, both: filelock names its lock file by its absolute path, and a relative --output
    # compared with it matched nothing (the raw "[Errno 30] ... '.res.lock'" came back, issue 52)
    target = Path(os.path.abspath(Path(output).expanduser()))
    if exc.filename is not None:
        name = Path(os.path.abspath(Path(os.fsdecode(exc.filename)).expanduser()))
        chain = [name, *name.parents]  # a file inside a staging folder of the output is the output's too
        ours = any(p.parent == target.parent and p.name.startswith(f".{helper_key(target)}.") for p in chain)
        if not (ours or name == target or target in name.parents or name == target.parent):
            return None
    parent = Path(output).expanduser().parent
    folder = parent if str(parent) else Path(".")
    return OutputWriteError(f"cannot write {what} '{output}': {_WRITE_ERRORS[code]} (in '{folder}')")


@contextlib.contextmanager
def writing(output: str | os.PathLike, what: str = "output") -> Iterator[None]:
    """Turn an ENOSPC/EDQUOT/EROFS/EACCES/EPERM/ENAMETOOLONG while writing ``output`` into one line
    naming it (:func:`write_error`); other errors pass unchanged."""
    try:
        yield
    except OSError as exc:
        error = write_error(exc, output, what)
        if error is None:
            raise
        raise error from None
    except Exception as exc:  # safetensors' writer reports the system's error as "... (os error 28)"
        found = _RUST_IO.search(str(exc))
        if found is None or "deserializ" in str(exc):
            raise
        error = write_error(OSError(int(found[1]), str(exc)), output, what)
        if error is None:
            raise
        raise error from None


def _remove_leftovers(output: Path) -> None:
    """Remove what a killed writer of exactly ``output`` was staging beside it: only helper files of
    this output (:func:`ropescale._io.helpers_of`) whose owner is provably gone."""
    recover_directory(output)  # a backup of a replaced output comes back first, if the output is missing
    for path in helpers_of(output, ("partial", "tmp", "new")):
        print(f"ropescale: removing {path}, left by a writer of '{output}' that was stopped", file=sys.stderr)
        with contextlib.suppress(OSError):
            remove_path(path)


def refuse_overwriting_inputs(
    output: str | os.PathLike,
    inputs: Mapping[str, str | os.PathLike[str] | None],
    flag: str = "--output",
    replaced_inside: bool = True,
    by: str = "--overwrite",
) -> None:
    """Refuse, before anything is deleted, an ``--overwrite`` target that is, contains or lies inside
    an input (see :func:`overlapping_input`): replacing it would delete what the command reads.

    Raises:
        RopescaleError: ``--output 'models' contains the model 'models/m'; --overwrite would delete it:
            choose an output outside the inputs``.
    """
    found = overlapping_input(output, inputs, replaced_inside)
    if found is not None:
        label, given, relation = found
        part = "part of it" if relation == "lies inside" else "it"
        raise RopescaleError(
            f"{flag} '{output}' {relation} the {label} '{given}'; {by} would delete {part}: "
            "choose an output outside the inputs"
        )


__all__ = [
    "OutputLockedError",
    "OutputWriteError",
    "write_error",
    "writing",
    "acquire",
    "lock_path",
    "output_lock",
    "refuse_overwriting_inputs",
    "release",
]
