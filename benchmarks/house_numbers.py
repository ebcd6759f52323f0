"""The house's numbers of issue 53, counted the same way before and after a change.

    python benchmarks/house_numbers.py                # every number; seconds on the embedded model's config
    python benchmarks/house_numbers.py --json         # the same as JSON
    python benchmarks/house_numbers.py --path         # and the modules the factor passes, in order

- **factor path** (held anywhere, and held loose): ``ropescale patch --factor 3.0625 --output TMP`` (a value no default has; the
  embedded model's checkpoint written to a temporary folder) run in this
  process under ``sys.setprofile``; every Python frame of ropescale's own code (``ropescale``, its
  ``cli`` and ``evals``) whose arguments or locals hold the factor, directly, in a dict, list or tuple
  or as an object's attribute, counts. The modules are listed in the order the factor reaches them;
  *modules* is how many distinct ones, *re-entries* how many times the factor comes back to a module it
  had left. The path ends where the checkpoint is written (``save_pretrained``): from there the scaling
  is config.json, checked as each loader reads it and read back to say which loaders keep it, JSON at
  the file boundary, which the issue leaves a dict. Only ropescale's code counts (argparse, transformers and the standard library do not).
- **dict[str, Any]**: annotations (arguments, returns, variables, fields) whose text is
  ``dict[str, Any]`` or ``Dict[str, Any]`` in ropescale/, evals/ and cli/, counted with ``ast``; an
  alias assigned to it counts at each use, as the issue asks (renaming is not typing). Also every
  annotation that mentions ``Any`` against all annotations.
- **largest files**: code lines (tests/test_layout.py's ``code_lines``: no blanks, comments or
  docstrings) of every file above the bar in ropescale/, evals/, cli/ and benchmarks/.
- **recommend's short answer**: the lines ``ropescale recommend --target-length 32768`` prints.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("ropescale", "evals", "cli")
SENTINEL = 3.0625

sys.path.insert(0, str(ROOT))
from tests.test_layout import code_lines  # noqa: E402 - the layout rule's own count of code lines

#: where the path ends: the checkpoint's config is written (``save_pretrained``); what reads it back as JSON
#: (the checks of what each loader reads, ``doctor``'s verdict) is the file boundary, not the value's path
STOP_AT = ("save_pretrained", "print_saved")


def _holds(value, depth: int = 0, loose: bool = False) -> bool:
    if isinstance(value, float) and not isinstance(value, bool) and value == SENTINEL:
        return True
    if depth >= 3:
        return False
    if isinstance(value, dict):
        return any(_holds(v, depth + 1, loose) for v in list(value.values())[:64])
    if isinstance(value, (list, tuple)):
        return any(_holds(v, depth + 1, loose) for v in list(value)[:64])
    if isinstance(value, argparse.Namespace):
        return any(_holds(v, depth + 1, loose) for v in vars(value).values())
    if loose:  # inside an object (a Scaling, a method, a plan) the factor is one value, not a loose float
        return False
    if isinstance(value, (str, bytes, int, type(None))) or type(value).__module__ in ("builtins", "torch"):
        return False
    if type(value).__module__.startswith("ropescale"):
        with contextlib.suppress(Exception):
            return any(_holds(v, depth + 1) for v in list(vars(value).values())[:64])
    return False


def _module_of(frame) -> str | None:
    name = frame.f_globals.get("__name__", "")
    if name.startswith(("ropescale", "cli", "evals")) and not name.endswith("house_numbers"):
        return name
    return None


def factor_path(loose: bool = False) -> list[str]:
    """The ropescale modules the factor passes through in ``ropescale patch --factor SENTINEL``, in order
    (``loose``: only where it is a bare float or in a dict, list, tuple or argparse namespace)."""
    from ropescale.cli.main import main

    seen: list[str] = []
    done: list[bool] = []

    def profile(frame, event, arg):
        if event not in ("call", "return") or done:
            return
        if frame.f_code.co_name in STOP_AT:  # the config is being written: JSON from here on (the file boundary)
            done.append(True)
            return
        module = _module_of(frame)
        if module is None:
            return
        try:
            local = dict(frame.f_locals)
        except Exception:  # noqa: BLE001 - a frame whose locals cannot be read
            return
        if any(_holds(v, loose=loose) for v in local.values()) and (not seen or seen[-1] != module):
            seen.append(module)

    import tempfile

    out = io.StringIO()
    with tempfile.TemporaryDirectory(prefix="house-numbers-") as tmp:
        sys.setprofile(profile)
        try:
            with contextlib.redirect_stdout(out):
                main(["patch", "--factor", str(SENTINEL), "--output", f"{tmp}/patched"])
        finally:
            sys.setprofile(None)
    return seen


def path_numbers(seen: list[str]) -> dict:
    reentries = sum(1 for i, m in enumerate(seen) if m in seen[:i])
    return {"modules": len(set(seen)), "re_entries": reentries, "order": seen}


def _is_dict_str_any(node: ast.AST) -> bool:
    text = ast.unparse(node).replace(" ", "")
    return text in ("dict[str,Any]", "Dict[str,Any]", "typing.Dict[str,Any]")


def annotations(folders=FOLDERS) -> dict:
    """Counts of annotations in ``folders``: ``dict[str, Any]`` ones (aliases of it counted at each use),
    those mentioning ``Any``, and all."""
    total = any_ = dict_any = 0
    per_folder: dict[str, int] = {}
    for folder in folders:
        n_folder = 0
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text())
            aliases = {
                t.id
                for node in ast.walk(tree)
                if isinstance(node, (ast.Assign, ast.AnnAssign))
                and node.value is not None
                and _is_dict_str_any(node.value)
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                if isinstance(t, ast.Name)
            }
            for node in ast.walk(tree):
                found = []
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    args = node.args
                    every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
                    found += [a.annotation for a in every if a is not None and a.annotation is not None]
                    if node.returns is not None:
                        found.append(node.returns)
                elif isinstance(node, ast.AnnAssign):
                    found.append(node.annotation)
                for ann in found:
                    total += 1
                    text = ast.unparse(ann)
                    if "Any" in text:
                        any_ += 1
                    inner = [ann, *ast.walk(ann)]
                    hit = any(_is_dict_str_any(n) for n in inner if isinstance(n, ast.Subscript))
                    hit = hit or any(isinstance(n, ast.Name) and n.id in aliases for n in inner)
                    if hit:
                        dict_any += 1
                        n_folder += 1
        per_folder[folder] = n_folder
    return {"dict_str_any": dict_any, "per_folder": per_folder, "annotations": total, "mention_any": any_}


def largest_files(bar: int = 350) -> list[tuple[str, int]]:
    rows = []
    for folder in (*FOLDERS, "benchmarks"):
        for path in (ROOT / folder).rglob("*.py"):
            n = code_lines(path.read_text())
            if n > bar:
                rows.append((str(path.relative_to(ROOT)), n))
    return sorted(rows, key=lambda r: -r[1])


def short_answer_lines() -> int:
    from ropescale.cli.main import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["recommend", "--target-length", "32768"])
    return len(out.getvalue().rstrip("\n").splitlines())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--path", action="store_true", help="list the modules the factor passes, in order")
    args = ap.parse_args(argv)
    numbers = {
        "factor_path": path_numbers(factor_path()),
        "loose_factor_path": path_numbers(factor_path(loose=True)),
        "annotations": annotations(),
        "files_over_350": largest_files(),
        "recommend_short_answer_lines": short_answer_lines(),
    }
    if args.json:
        print(json.dumps(numbers, indent=1))
        return 0
    fp, an = numbers["factor_path"], numbers["annotations"]
    print(
        f"factor path (ropescale patch --factor {SENTINEL} --output TMP): {fp['modules']} modules, {fp['re_entries']} re-entries"
    )
    if args.path:
        print("  " + " -> ".join(fp["order"]))
    lp = numbers["loose_factor_path"]
    print(f"  held loose (a float, a dict, a namespace): {lp['modules']} modules, {lp['re_entries']} re-entries")
    if args.path:
        print("  " + " -> ".join(lp["order"]))
    print(
        f"dict[str, Any]: {an['dict_str_any']} ({', '.join(f'{k} {v}' for k, v in an['per_folder'].items())}); "
        f"annotations mentioning Any: {an['mention_any']} of {an['annotations']}"
    )
    files = numbers["files_over_350"]
    print(f"files over 350 code lines: {len(files)}" + "".join(f"\n  {n:4d} {p}" for p, n in files))
    print(f"recommend's short answer: {numbers['recommend_short_answer_lines']} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
