"""Getting a corpus's source files out of Debian packages, for :mod:`ropescale.data.corpus`.

* fetching: ``apt-get download`` (works without root) and ``dpkg-deb -x`` into a temporary
  directory, or the files of a system-wide installation;
* R lazy-load databases (``data/Rdata.rdb``/``.rdx``, how R packages such as janeaustenr store
  their data), parsed with the PyPI package ``rdata``.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
import shutil
import subprocess
import warnings
import zlib
from pathlib import Path

from ..errors import MissingDependencyError
from .corpus_types import CorpusInstallError

# ------------------------------------------------------------------- R lazy-load DB (janeaustenr)


def _decompress_any(data: bytes) -> bytes:
    """Undo gzip/bzip2/xz by magic number; anything else is returned as is."""
    if data[:2] == b"\x1f\x8b":
        return gzip.decompress(data)
    if data[:3] == b"BZh":
        return bz2.decompress(data)
    if data[:6] == b"\xfd7zXZ\x00":
        return lzma.decompress(data)
    return data


def _rdata():
    try:
        import rdata  # noqa: PLC0415
    except ImportError as exc:
        raise MissingDependencyError(
            "reading the Austen corpus needs the PyPI package rdata: pip install 'rdata>=0.11'"
        ) from exc
    return rdata


def _unserialize(data: bytes):
    """Parse one R-serialized object (``X\\n`` XDR format, version 2 or 3) into Python."""
    rdata = _rdata()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Unknown file type: assumed RDS" for bare streams
        return rdata.conversion.convert(rdata.parser.parse_data(data))


def _decompress_rdb_entry(blob: bytes, compressed: object) -> bytes:
    """One value of a lazy-load ``.rdb``: 4-byte big-endian length, then the compressed stream.

    ``compressed`` is the ``.rdx`` flag: TRUE/1 zlib; 2 bzip2 and 3 xz carry a type byte after
    the length ('2' bzip2, 'Z' xz, '0' stored); FALSE/0 stored.
    """
    if len(blob) < 4:
        raise CorpusInstallError("truncated entry in the R lazy-load database")
    expected = int.from_bytes(blob[:4], "big")
    kind = int(compressed)
    if kind == 0:
        out = blob[4:]
    elif kind == 1:
        out = zlib.decompress(blob[4:])
    else:
        tag, body = blob[4:5], blob[5:]
        if tag == b"Z":
            out = lzma.decompress(body)
        elif tag == b"2":
            out = bz2.decompress(body)
        elif tag == b"0":
            out = body
        else:
            raise CorpusInstallError(f"unknown compression tag {tag!r} in the R lazy-load database")
    if len(out) != expected:
        raise CorpusInstallError(f"R lazy-load entry is {len(out)} bytes, its header says {expected}")
    return out


def read_lazyload_db(base: str | os.PathLike) -> dict[str, object]:
    """All values of the R lazy-load database ``base.rdx``/``base.rdb``, by variable name."""
    base = Path(base)
    rdx, rdb = base.with_name(base.name + ".rdx"), base.with_name(base.name + ".rdb")
    if not rdx.is_file() or not rdb.is_file():
        raise CorpusInstallError(f"no R lazy-load database at {base}.rdx/.rdb")
    index = _unserialize(_decompress_any(rdx.read_bytes()))
    try:
        variables = index["variables"]
        flag = index.get("compressed", True)
    except (KeyError, TypeError, AttributeError) as exc:
        raise CorpusInstallError(f"{rdx} is not a lazy-load index") from exc
    flag = flag[0] if hasattr(flag, "__len__") else flag
    payload = rdb.read_bytes()
    values = {}
    for key, pos in variables.items():
        offset, length = int(pos[0]), int(pos[1])
        blob = payload[offset : offset + length]
        values[str(key)] = _unserialize(_decompress_rdb_entry(blob, flag))
    return values


# --------------------------------------------------------------------------- fetching packages


def _run(cmd: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    except FileNotFoundError as exc:
        raise CorpusInstallError(
            f"{cmd[0]} not found: corpora are installed from Debian's package archive "
            "(elsewhere, unpack the .deb yourself and pass --from DIR)"
        ) from exc


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("E:")]
    return (errors or lines or ["no output"])[-1]


def _apt_download(package: str, dest: Path) -> Path:
    """``apt-get download`` into ``dest`` (works without root); one ``apt-get update`` retry as root."""
    proc = _run(["apt-get", "download", package], cwd=dest)
    if proc.returncode != 0 and hasattr(os, "geteuid") and os.geteuid() == 0:
        _run(["apt-get", "update", "-q"])
        proc = _run(["apt-get", "download", package], cwd=dest)
    debs = sorted(dest.glob(f"{package}_*.deb"))
    if proc.returncode != 0 or not debs:
        hint = " (the package lists may be missing: run `apt-get update` as root)" if "locate" in proc.stderr else ""
        raise CorpusInstallError(f"apt-get download {package} failed: {_last_line(proc.stderr)}{hint}")
    return debs[-1]


def _deb_version(deb: Path) -> str:
    proc = _run(["dpkg-deb", "-f", str(deb), "Version"])
    return proc.stdout.strip() if proc.returncode == 0 and proc.stdout.strip() else "unknown"


def _extract_deb(deb: Path, root: Path) -> None:
    proc = _run(["dpkg-deb", "-x", str(deb), str(root)])
    if proc.returncode != 0:
        raise CorpusInstallError(f"dpkg-deb -x {deb.name} failed: {_last_line(proc.stderr)}")


def _installed_version(package: str) -> str | None:
    """Version of a system-installed Debian package, or None."""
    if shutil.which("dpkg-query") is None:
        return None
    proc = _run(["dpkg-query", "-W", "-f", "${Status}\t${Version}", package])
    status, _, version = proc.stdout.partition("\t")
    return version if proc.returncode == 0 and status.endswith(" installed") else None
