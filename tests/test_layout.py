"""The house rule, checked from the code's own imports (every module, top-level and lazy imports alike).

``cli → evals → ropescale``; inside evals ``advice, suite, lm_eval → report → tasks`` (the advice reads
results, the suite runner writes them, the task rows run cells); inside the library
``training, search, export → scoring, plots → models, data → patching → attention → rotary, methods, interop``.
Nothing imports upward or in a circle, ``import ropescale`` loads neither ``evals`` nor ``cli``,
and no source file holds more than 450 lines of code. Docstrings, comments and blank lines are not
counted: a file is split when its code grows past one concept, never by cutting an explanation.
"""

from __future__ import annotations

import ast
import io
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: top-level folder -> the package it installs as
PACKAGE_DIRS = {"ropescale": "ropescale", "cli": "ropescale.cli", "evals": "ropescale.evals"}
#: every top-level folder the wheel installs (the rooms, and the recipes' package)
WHEEL_DIRS = {**PACKAGE_DIRS, "configs": "ropescale.configs"}
#: each room's floor: a module may import its own room and rooms on lower floors only
FLOORS = {
    "ropescale.cli": 12,
    "ropescale.evals.advice": 11,  # recommend, evidence, the frontier: read results, run nothing
    "ropescale.evals.suite": 11,  # the suite runner: runs the task rows, writes the report
    "ropescale.evals.lm_eval": 11,  # lm-eval's model and runner
    "ropescale.evals.report": 10,  # cell records, their keys, results.json and report.md
    "ropescale.evals.tasks": 9,  # the task rows and what runs them
    "ropescale.evals": 8,  # the package's own __init__ (empty)
    "ropescale.training": 7,
    "ropescale.search": 7,
    "ropescale.export": 7,
    "ropescale.scoring": 6,
    "ropescale.plots": 6,
    "ropescale.models": 5,
    "ropescale.data": 5,
    "ropescale.patching": 4,
    "ropescale.attention": 3,
    "ropescale.interop": 2,
    "ropescale.rotary_reference": 2,
    "ropescale.methods": 2,
    "ropescale._lock": 1,  # one writer per output (raises RopescaleError)
    "ropescale.options": 0,
    "ropescale.rope_math": 0,  # closed forms several rooms share (YaRN's attention temperature)
    "ropescale.errors": 0,
    "ropescale.markdown": 0,  # markdown tables (tabulate)
    "ropescale._io": 0,
    "ropescale._yaml": 1,  # YAML from users: duplicate keys refused (raises RopescaleError)
    "ropescale": 0,  # the package's own __init__ (lazy names only)
}
MAX_LINES = 450


def _modules() -> dict[str, Path]:
    found = {}
    for folder, package in PACKAGE_DIRS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


def _room(module: str) -> str:
    return max((r for r in FLOORS if module == r or module.startswith(r + ".")), key=len)


def _imports(module: str, path: Path) -> set[str]:
    """Every ropescale module ``module`` imports, anywhere in the file (lazy imports included)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names.add(target)
            names |= {f"{target}.{a.name}" for a in node.names}
    return {n for n in names if n == "ropescale" or n.startswith("ropescale.")}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {}
    for module, path in modules.items():
        targets = set()
        for name in _imports(module, path):
            while name not in modules and "." in name:
                name = name.rpartition(".")[0]  # ``from pkg import name`` names an attribute
            if name in modules and name != module:
                targets.add(name)
        graph[module] = targets
    return graph


def test_every_module_has_a_room():
    assert all(_room(m) for m in _modules())


def test_nothing_imports_upward():
    upward = [
        f"{m} ({_room(m)}) -> {t} ({_room(t)})"
        for m, targets in _graph().items()
        for t in targets
        if _room(t) != _room(m) and FLOORS[_room(t)] >= FLOORS[_room(m)] and _room(m) != "ropescale"
    ]
    assert upward == []


def test_no_import_circles():
    graph, state, circles = _graph(), {}, []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                circles.append(" -> ".join(stack[stack.index(nxt) :] + [node, nxt]) if nxt in stack else nxt)
            elif nxt not in state:
                visit(nxt, [*stack, node])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    assert circles == []


def test_the_library_never_imports_evals_or_cli():
    offenders = [
        f"{m} -> {t}"
        for m, targets in _graph().items()
        if not _room(m).startswith(("ropescale.cli", "ropescale.evals"))
        for t in targets
        if _room(t).startswith(("ropescale.cli", "ropescale.evals"))
    ]
    assert offenders == []


def test_import_ropescale_loads_neither_evals_nor_cli():
    code = "import sys, ropescale; print(sorted(m for m in sys.modules if m.startswith(('ropescale.evals', 'ropescale.cli'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def code_lines(source: str) -> int:
    """Lines that hold code: not blank, not only a comment, not inside a docstring (a string statement)."""
    lines: set[int] = set()
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    for i, tok in enumerate(tokens):
        if tok.type in skip:
            continue
        if tok.type == tokenize.STRING:
            before = next((t for t in reversed(tokens[:i]) if t.type not in (tokenize.NL, tokenize.COMMENT)), None)
            after = tokens[i + 1] if i + 1 < len(tokens) else None
            starts = before is None or before.type in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
            if starts and after is not None and after.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
                continue  # a docstring (or a bare string statement): explanation, not code
        lines.update(range(tok.start[0], tok.end[0] + 1))
    return len(lines)


def test_code_lines_leave_out_docstrings_and_comments():
    src = 'def f():\n    """One.\n\n    Two.\n    """\n    # why\n\n    return 1  # trailing\n'
    assert code_lines(src) == 2
    assert code_lines('x = """a\nb"""\n') == 2  # a string that is a value is code


@pytest.mark.parametrize("folder", ["ropescale", "cli", "evals", "benchmarks"])
def test_no_source_file_is_too_long(folder):
    long = {
        str(p.relative_to(ROOT)): n
        for p in (ROOT / folder).rglob("*.py")
        if (n := code_lines(p.read_text())) > MAX_LINES
    }
    assert long == {}


def test_the_checker_sees_a_violation(tmp_path, monkeypatch):
    """The rule can fail: an upward import planted in a copy of a methods module is reported."""
    fake = tmp_path / "ropescale" / "methods"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("from ..models import loading\n")
    assert "ropescale.models.loading" in _imports("ropescale.methods", fake / "__init__.py")
    assert FLOORS[_room("ropescale.models.loading")] > FLOORS[_room("ropescale.methods")]
    # and inside evals: a task row reaching for the report, or the report for the advice, is upward
    assert FLOORS[_room("ropescale.evals.report.cell_keys")] > FLOORS[_room("ropescale.evals.tasks.task_base")]
    assert FLOORS[_room("ropescale.evals.advice.evidence")] > FLOORS[_room("ropescale.evals.report.cell_keys")]


def test_every_package_folder_is_in_the_wheel():
    """Each folder with an ``__init__.py`` under the package folders is listed in pyproject's ``packages``: an
    unlisted one is missing from the wheel, and every import of it fails there (``ropescale.evals.ruler`` was:
    ``eval ruler`` worked from the checkout only)."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = set()
    for top, package in WHEEL_DIRS.items():
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / top).parts
            found.add(".".join((package, *rel)))
    assert found - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
