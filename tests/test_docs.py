"""The docs say only what exists: the README fits a first visit, every relative link and anchor and
every file path the README and docs/ name exists, and every ``ropescale`` command line in the README
parses with the real argparse tree (a dry parse: nothing runs, nothing loads)."""

from __future__ import annotations

import re
import shlex
import unicodedata
from pathlib import Path

import pytest

from ropescale.cli.main import UsageError, build_parser

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, ROOT / "CHANGELOG.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: a README a newcomer reads on a first visit (torchtune's is ~17 KB, litgpt's ~15 KB)
README_MAX_BYTES = 15_000
#: pages other branches add; drop an entry once that branch is merged (the test then checks it exists)
PENDING: set[str] = set()
#: backticked repository paths, e.g. `ropescale/methods/yarn.py` (no placeholders, globs or runs/ outputs)
PATH = re.compile(r"`((?:ropescale|evals|cli|tests|benchmarks|configs|docs)/[\w./-]+)`")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower()
    text = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, flags=re.M)}


def test_readme_fits_a_first_visit():
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size:,} bytes; move detail to docs/ (limit {README_MAX_BYTES:,})"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_and_paths_exist(page: Path):
    text = page.read_text()
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
        if not file.exists():
            missing.append(f"link {target}")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            missing.append(f"anchor {target}")
    for m in PATH.finditer(text):
        rel = m.group(1).rstrip(".")
        if rel not in PENDING and not (ROOT / rel).exists():
            missing.append(f"path {rel}")
    assert not missing, f"{page.relative_to(ROOT)} names what does not exist: {missing}"


def readme_commands() -> list[str]:
    """Every ``ropescale ...`` command line of the README: in bash blocks (continuations joined,
    comments dropped, split at ``&&``), ``$(ropescale ...)``, ``-m ropescale.cli.main ...`` and inline code."""
    text = README.read_text()
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            lines += [part.strip() for part in re.sub(r"\s#\s.*$", "", line).split("&&")]
    lines += re.findall(r"`(ropescale [^`]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    commands = []
    for line in lines:
        commands += re.findall(r"\$\((ropescale [^)]+)\)", line)
        line = re.sub(r"\"?\$\(ropescale [^)]+\)\"?", "CONFIG", line)
        if line.startswith("ropescale "):
            commands.append(line)
        elif " -m ropescale.cli.main " in line:
            commands.append("ropescale " + line.split(" -m ropescale.cli.main ", 1)[1])
    return commands


def test_readme_names_commands():
    commands = readme_commands()
    assert len(commands) >= 8
    assert {c.split()[1] for c in commands} >= {
        "recommend",
        "patch",
        "eval",
        "train",
        "export",
        "export-gguf",
        "doctor",
    }


@pytest.mark.parametrize("command", readme_commands())
def test_readme_command_parses(command: str):
    parser = build_parser()
    try:
        args = parser.parse_args(shlex.split(command)[1:])
    except UsageError as exc:
        pytest.fail(f"README command does not parse: {command}\n{exc}")
    assert callable(args.func)
