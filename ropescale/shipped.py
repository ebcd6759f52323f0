"""The configuration files ropescale ships: training recipes and accelerate configs.

They live in ``configs/`` at the top of the repository and install as the package data of
``ropescale.configs`` (see pyproject's ``package-dir``), so names resolve the same from a checkout,
an editable install or a wheel.
"""

from __future__ import annotations

from pathlib import Path

from .errors import RopescaleError


def configs_root() -> Path:
    """``configs/``: the installed ``ropescale.configs`` package, else the checkout's directory."""
    from importlib import resources

    try:
        root = Path(str(resources.files("ropescale.configs")))
    except (ModuleNotFoundError, TypeError):  # not installed as a package (a bare source tree)
        root = Path()
    if (root / "train").is_dir():
        return root
    return Path(__file__).resolve().parent.parent / "configs"


def accelerate_configs() -> dict[str, Path]:
    """Shipped accelerate configs by name (``ddp``, ``fsdp``)."""
    return {p.stem: p for p in sorted((configs_root() / "accelerate").glob("*.yaml"))}


def recipes() -> dict[str, Path]:
    """Shipped training recipes by name (``smollm2-135m/pose_yarn_x4_cpu``)."""
    train = configs_root() / "train"
    return {str(p.relative_to(train).with_suffix("")): p for p in sorted(train.rglob("*.yaml"))}


def config_path(name: str) -> Path:
    """The file of a shipped accelerate config or training recipe, by name (``fsdp``, ``llama2-7b/yarn_x8``).

    Raises:
        RopescaleError: one line listing the names there are.
    """
    key = str(name).removesuffix(".yaml")
    for table in (accelerate_configs(), recipes()):
        if key in table:
            return table[key]
    known = ", ".join([*accelerate_configs(), *recipes()])
    raise RopescaleError(f"no shipped config named '{name}'; known: {known or 'none'}")
