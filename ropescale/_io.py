"""Atomic writes: a reader never sees a half-written file or directory."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import secrets
import shutil
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any


def cache_root() -> Path:
    """Where ropescale keeps converted models and corpora: ``$ROPESCALE_CACHE`` or ``~/.cache/ropescale``.

    Raises:
        ValueError: the path (or a folder above it) is a file: said before anything is converted.
    """
    env = os.environ.get("ROPESCALE_CACHE")
    root = Path(env or Path.home() / ".cache" / "ropescale").expanduser()
    where = root
    while not where.exists() and where != where.parent:
        where = where.parent
    if where.exists() and not where.is_dir():
        name = f"ROPESCALE_CACHE = '{env}'" if env else f"the cache folder '{root}'"
        what = "is a file" if where == root else f"lies under the file '{where}'"
        raise ValueError(f"{name} {what}, not a folder; point ROPESCALE_CACHE at a folder")
    return root


# ----------------------------------------------------------------------------- helper files
#
# Every temporary, staging, backup and lock file of an output ``NAME`` is named
# ``.KEY.OWNER.KIND``: KEY is NAME (or, above 200 bytes, its first bytes and a sha256 digest, so a
# legal 255-byte name still leaves room), OWNER is ``HOST-PID-START-NONCE`` (an 8-hex digest of the
# host name, the writer's pid and its start time in clock ticks, a random nonce) and KIND one of
# ``tmp partial old new``. A name belongs to NAME only if the part after ``.KEY.`` matches that
# pattern in full: the staging file ``.tx.gguf.OWNER.tmp`` of ``tx.gguf`` is never taken for one of
# ``tx`` (the older ``.NAME.*`` prefix pattern matched it). Leftovers are removed only when their
# owner is provably gone: same host, and no process with that pid and start time.

_MAX_KEY = 200  # bytes: ".KEY." + OWNER (<= 45) + ".partial" stays under the 255-byte name limit
_OWNER = re.compile(
    r"(?P<host>[0-9a-f]{8})-(?P<pid>[0-9]+)-(?P<start>[0-9]+|x)-[0-9a-f]{8}\.(?P<kind>tmp|partial|old|new)"
)


def helper_key(output: str | os.PathLike) -> str:
    """The part of an output's helper-file names that names the output (see above)."""
    name = Path(output).name
    raw = os.fsencode(name)
    if len(raw) <= _MAX_KEY:
        return name
    head = raw[: _MAX_KEY - 18].decode("utf-8", "ignore")
    return f"{head}~{hashlib.sha256(raw).hexdigest()[:16]}"


def process_start(pid: int) -> str | None:
    """The start time of a process in clock ticks since boot (Linux; None elsewhere or when gone),
    to tell a reused pid apart; ``"zombie"`` for a process that has exited but is not yet reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":
        return "zombie"
    return fields[19]


def host_tag() -> str:
    """An 8-hex digest of this host's name (helper names must stay short and file-name safe)."""
    import socket

    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def helper_path(output: str | os.PathLike, kind: str, pid: int | None = None) -> Path:
    """A fresh helper-file name of ``output`` owned by this process (``kind``: tmp, partial, old, new)."""
    output = Path(output)
    pid = os.getpid() if pid is None else pid
    start = process_start(pid)
    owner = f"{host_tag()}-{pid}-{start if start and start.isdigit() else 'x'}-{secrets.token_hex(4)}"
    return output.with_name(f".{helper_key(output)}.{owner}.{kind}")


_ACTIVE: set[Path] = set()  # this process's helper files in use (another of its own is a leftover)


@contextlib.contextmanager
def _in_use(path: Path) -> Iterator[Path]:
    _ACTIVE.add(path)
    try:
        yield path
    finally:
        _ACTIVE.discard(path)


def _owner_alive(match: re.Match, path: Path) -> bool:
    if match["host"] != host_tag():
        return True  # another host's process cannot be checked from here: never removed
    pid = int(match["pid"])
    if pid == os.getpid():  # ours: a backup left by an interrupted block of this process is recovered
        return match["kind"] != "old" or path in _ACTIVE
    return process_alive(pid, None if match["start"] == "x" else match["start"])


def process_alive(pid: int, recorded_start: str | None) -> bool:
    """Whether process ``pid`` still runs and is the one that started at ``recorded_start`` (a reused
    pid is another process); where either start time is unknown, a running ``pid`` counts as alive."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process: it exists
    start = process_start(pid)
    if start == "zombie":
        return False
    return not (recorded_start and start and start != recorded_start)


def helpers_of(output: str | os.PathLike, kinds: tuple[str, ...], dead_only: bool = True) -> list[Path]:
    """The helper files of exactly ``output`` of the given kinds (by the pattern above), oldest first;
    ``dead_only``: only those whose writer is provably gone."""
    output = Path(output)
    prefix = f".{helper_key(output)}."
    if not output.parent.is_dir():
        return []
    found = []
    for path in output.parent.iterdir():
        if not path.name.startswith(prefix):
            continue
        match = _OWNER.fullmatch(path.name[len(prefix) :])
        if match and match["kind"] in kinds and not (dead_only and _owner_alive(match, path)):
            found.append(path)
    return sorted(found, key=lambda p: p.lstat().st_mtime)


def _create_sibling(path: Path) -> tuple[int, Path]:
    """Create a new empty temporary file beside ``path``; return its descriptor and name.

    ``mkstemp`` would create it with mode 0600, which the rename would then give to ``path``; opening
    a fresh name with 0666 lets the umask decide, as for any ordinary file.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    for _ in range(100):
        tmp = helper_path(path, "tmp")
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"could not create a temporary file beside {path}")


def _atomic_write(path: str | os.PathLike, data: str | bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _create_sibling(path)
    try:
        with os.fdopen(fd, "wb") if isinstance(data, bytes) else os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` through a temporary file in the same directory and rename it.

    The file gets the usual permissions (0666 less the umask), whether or not ``path`` existed.
    """
    _atomic_write(path, text)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same directory and rename it.

    Args:
        path: the file to write; missing parent directories are created.
        data: its complete contents.

    A reader sees the old file or the new one, never a part; the file gets the usual permissions
    (0666 less the umask), and the temporary file is removed if anything fails.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"data must be bytes, got {type(data).__name__}")
    _atomic_write(path, bytes(data))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write ``obj`` as indented JSON, atomically."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step with Linux's ``renameat2(RENAME_EXCHANGE)``; False where unavailable.

    Returns:
        True when swapped; False when the platform, libc or file system cannot (then nothing moved).
    """
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2  # glibc >= 2.28
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False  # an old kernel, or a file system without the flag
    raise OSError(code, os.strerror(code), str(a))


def recover_directory(path: str | os.PathLike) -> bool:
    """Finish a directory replacement that was interrupted (see :func:`atomic_directory`).

    Where the portable replacement was cut between its two renames, ``path`` is missing and the old
    output waits beside it as a backup (``.<key>.<owner>.old``, see :func:`helper_path`): it is
    renamed back. A backup beside a complete ``path`` (cut after the new one was in place) is removed.
    Only backups of exactly ``path`` whose writer is gone are touched: a live writer is between its
    two renames, and finishes them itself.

    Returns:
        True if an output was restored at ``path``.
    """
    path = Path(path)
    backups = [p for p in helpers_of(path, ("old",)) if p.is_dir() and not p.is_symlink()]
    restored = False
    if backups and not path.exists():
        os.replace(backups.pop(), path)  # the newest backup is the output that was being replaced
        restored = True
    for stale in backups:
        shutil.rmtree(stale, ignore_errors=True)
    return restored


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling directory that is renamed to ``path`` only if the block succeeds.

    If the block raises, the temporary directory is removed and ``path`` is left as it was.
    With ``overwrite``, an existing ``path`` is replaced after the new one is complete: in one
    atomic swap on Linux (``renameat2``), elsewhere by moving the old one aside first; an
    interruption between those two renames is undone by the next call (:func:`recover_directory`).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    recover_directory(path)
    if path.exists() and not overwrite and any(path.iterdir()):
        raise FileExistsError(f"{path} exists and is not empty")
    tmp = helper_path(path, "partial")
    tmp.mkdir()  # the usual permissions (0777 less the umask), like any mkdir
    try:
        yield tmp
        if path.exists():
            if _exchange(tmp, path):
                with contextlib.suppress(OSError):
                    remove_path(tmp)  # tmp now holds the old output (a symlink there: only the link goes)
                return
            with _in_use(helper_path(path, "old")) as old:
                os.replace(path, old)
                os.replace(tmp, path)
                shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def sha256_file(path: str | os.PathLike) -> str:
    """The SHA-256 hex digest of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


_WHOLE = 1 << 22  # files up to 4 MiB are hashed whole
_BLOCK = 1 << 16


def content_fingerprint(path: str | os.PathLike) -> str:
    """A quick identity of a file's content: its size and the sha256 of the whole file up to 4 MiB,
    beyond that of 17 blocks of 64 KiB spread evenly over it (the first and the last included).

    Two different checkpoints (fine-tunes, seeds, quantizations) differ in every block, so a sample
    tells them apart without reading gigabytes; the full :func:`sha256_file` is for integrity, not this.
    """
    path = Path(path)
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with path.open("rb") as f:
        if size <= _WHOLE:
            h.update(f.read())
        else:
            for i in range(17):
                f.seek((size - _BLOCK) * i // 16)
                h.update(f.read(_BLOCK))
    return h.hexdigest()


def remove_path(path: str | os.PathLike) -> None:
    """Remove a file, a folder tree or a symlink; a symlink is unlinked itself, never followed.

    ``shutil.rmtree`` refuses a symlinked folder, and ``is_dir()`` follows links: clearing an output
    with those would either crash half-way or delete what a link points at, outside the output.
    """
    path = Path(path)
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path)  # links inside the tree are unlinked, not followed


def _within(inner: Path, outer: Path) -> bool:
    return inner == outer or outer in inner.parents


def overlapping_input(
    output: str | os.PathLike, inputs: Mapping[str, str | os.PathLike[str] | None], replaced_inside: bool = True
) -> tuple[str, str, str] | None:
    """The first input that replacing ``output`` would delete: ``(label, input as given, relation)`` or None.

    Args:
        output: the folder or file ``--overwrite`` would replace (or whose entries it would clear).
        inputs: ``{label: path}`` of what the command reads (model folder, data, checkpoint, results);
            a value that is not an existing path (a Hub id, an embedded model's name, None) is skipped.
        replaced_inside: an existing output that lies inside an input folder counts too (replacing
            it deletes part of that input); False where only named files of the output are replaced.

    Paths are compared with symlinks resolved: a link to the model folder is the model folder.
    """
    out = Path(output).expanduser()
    if not (out.exists() or out.is_symlink()):
        return None
    resolved = out.resolve()
    for label, given in inputs.items():
        if given is None or not Path(str(given)).expanduser().exists():
            continue
        source = Path(str(given)).expanduser().resolve()
        if source == resolved:
            return label, str(given), "is"
        if _within(source, resolved):
            return label, str(given), "contains"
        if replaced_inside and _within(resolved, source):
            return label, str(given), "lies inside"
    return None
