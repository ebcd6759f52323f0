"""The wheel carries what the README promises: built from the sources, installed into a fresh venv
and run from outside the checkout, it lists the methods, finds its accelerate configs and validates
every shipped training recipe by name.

The fresh venv gets the project's dependencies through a ``.pth`` naming this interpreter's
site-packages (nothing is downloaded); ropescale itself must come from the wheel. Building needs a
setuptools that can make wheels (>= 70.1, or an older one with ``wheel``); the newest one on
``sys.path`` is put first for the build.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SOURCES = ("ropescale", "cli", "evals", "configs", "pyproject.toml", "README.md")


def _site_packages() -> list[str]:
    return [p for p in sys.path if p.rstrip("/").endswith("site-packages") and os.path.isdir(p)]


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def _wheel_building_setuptools() -> str | None:
    """The site-packages with the newest setuptools that builds wheels by itself (>= 70.1)."""
    found = []
    for site in _site_packages():
        for info in Path(site).glob("setuptools-*.dist-info"):
            version = _version(info.name.removeprefix("setuptools-"))
            if version >= (70, 1):
                found.append((version, site))
    return max(found)[1] if found else None


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(python, ropescale script, clean env, work dir) of a fresh venv with the wheel installed."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in SOURCES:  # a copy, so the build leaves nothing in the checkout
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(source, src / name)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["HF_HUB_OFFLINE"] = "1"
    build_env = dict(env)
    setuptools_site = _wheel_building_setuptools()
    if setuptools_site is None:
        pytest.skip("no setuptools >= 70.1 on sys.path to build the wheel without a download")
    build_env["PYTHONPATH"] = setuptools_site
    dist = tmp / "dist"
    _run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(src), "-w", str(dist)],
        tmp,
        build_env,
    )
    wheel = next(dist.glob("ropescale-*.whl"))
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp, env)
    python = venv / "bin" / "python"
    site = Path(
        _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp, env).strip()
    )
    (site / "_ropescale_test_deps.pth").write_text("\n".join(_site_packages()) + "\n")
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(wheel)], tmp, env)
    work = tmp / "elsewhere"
    work.mkdir()
    return python, venv / "bin" / "ropescale", env, work, venv


def test_ropescale_is_imported_from_the_fresh_venv(installed):
    python, _, env, work, venv = installed
    out = _run(
        [
            str(python),
            "-c",
            "import ropescale, ropescale.shipped as s; print(ropescale.__file__); print(s.configs_root())",
        ],
        work,
        env,
    ).split()
    assert all(Path(p).resolve().is_relative_to(venv.resolve()) for p in out), out
    assert not any(str(REPO) in p for p in out)


def test_console_script_lists_methods_and_finds_accelerate_configs(installed):
    _, script, env, work, venv = installed
    assert re.search(r"^yarn\s+static", _run([str(script), "methods"], work, env), re.M)
    for name in ("fsdp", "ddp"):
        path = Path(_run([str(script), "config-path", name], work, env).strip())
        assert path.is_file() and path.name == f"{name}.yaml" and path.resolve().is_relative_to(venv.resolve())
        assert path.read_text() == (REPO / "configs" / "accelerate" / f"{name}.yaml").read_text()


def test_every_shipped_recipe_validates_by_name(installed):
    python, script, env, work, _ = installed
    shipped = sorted(
        str(p.relative_to(REPO / "configs" / "train").with_suffix(""))
        for p in (REPO / "configs" / "train").rglob("*.yaml")
    )
    listed = [
        line.split()[1]
        for line in _run([str(script), "config-path", "--list"], work, env).splitlines()
        if line.startswith("recipe")
    ]
    assert sorted(listed) == shipped
    # `ropescale train --config NAME --dry-run` for every recipe, in one interpreter to keep this fast
    loop = (
        "import sys; from ropescale.cli.main import main\n"
        "for name in sys.argv[1:]:\n"
        "    code = main(['train', '--config', name, '--dry-run'])\n"
        "    print('EXIT', name, code)\n"
    )
    out = _run([str(python), "-c", loop, *shipped], work, env)
    assert [line for line in out.splitlines() if line.startswith("EXIT")] == [f"EXIT {n} 0" for n in shipped]
    assert out.count("recipe:") == len(shipped)


def test_every_module_of_the_checkout_imports_from_the_wheel(installed):
    """A module the wheel leaves out fails only where it is imported, often lazily (``ropescale.evals.ruler``
    did: ``eval ruler`` and ``recommend`` worked from the checkout and not from the wheel)."""
    python, _, env, work, _ = installed
    from tests.test_layout import WHEEL_DIRS

    modules = sorted(
        ".".join((package, *p.relative_to(REPO / top).with_suffix("").parts)).removesuffix(".__init__")
        for top, package in WHEEL_DIRS.items()
        for p in (REPO / top).rglob("*.py")
        if "__pycache__" not in p.parts and (p.parent / "__init__.py").exists()
    )
    loop = (
        "import importlib, sys\n"
        "for name in sys.argv[1:]:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ModuleNotFoundError as exc:\n"
        "        if (exc.name or '').startswith('ropescale'):\n"
        "            print('MISSING', name, exc.name)\n"
    )
    assert len(modules) > 100
    out = _run([str(python), "-c", loop, *modules], work, env)
    assert [line for line in out.splitlines() if line.startswith("MISSING")] == []
