"""Arguments shared by every command that loads and scales a model."""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from ropescale import options
from ropescale.errors import RopescaleError

if TYPE_CHECKING:
    from ropescale.scaling import Scaling


def typed(parse: Callable[..., Any], name: str | None = None) -> Callable[[str], Any]:
    """An argparse ``type=`` from a :mod:`ropescale.options` parser: the parser's one-line
    ``ValueError`` becomes argparse's usage error (``argument --factor: factor must be a number...``).

    Args:
        parse: e.g. :func:`ropescale.options.factor`.
        name: passed to ``parse`` as the value's name (none: the parser's default).

    Returns:
        A one-argument callable for ``add_argument(type=...)``.
    """

    def convert(text: str) -> Any:
        try:
            return parse(text) if name is None else parse(text, name)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = getattr(parse, "__name__", "value")
    return convert


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        default="smollm2-135m",
        help="checkpoint directory, .gguf file, Hub id (org/name), or embedded model name (default: smollm2-135m)",
    )


def add_runtime_args(p: argparse.ArgumentParser) -> None:
    """--device / --dtype / --attn-implementation, resolved by :func:`ropescale.models.runtime.resolve_runtime`."""
    p.add_argument("--device", default="auto", help="auto (cuda when available, else cpu), cpu, cuda, cuda:N, mps")
    from ropescale.models.runtime import ATTENTIONS, DTYPES

    p.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", *DTYPES],
        help="auto: bfloat16 on a CUDA device (float16 without bf16) and on a CPU with AMX or AVX512-BF16 "
        "instructions, float32 otherwise (bf16 emulated is 3-8x slower)",
    )
    p.add_argument(
        "--attn-implementation",
        default="auto",
        choices=["auto", *ATTENTIONS],
        help="auto: flash_attention_2 on a CUDA device when flash-attn is installed, else sdpa",
    )


def add_original_context_arg(p: argparse.ArgumentParser) -> None:
    """``--original-max-position-embeddings N``: the trained context, where the config does not say it."""
    p.add_argument(
        "--original-max-position-embeddings",
        type=_length,
        default=None,
        metavar="N",
        help="the context the model was trained at, if its config does not say it",
    )


def add_scaling_args(
    p: argparse.ArgumentParser, factor_required: bool = True, default_method: str = "yarn", method_help: str = ""
) -> None:
    p.add_argument(
        "--method",
        default=default_method,
        help=method_help or f"scaling method (see `ropescale methods`; default: {default_method})",
    )
    add_factor_args(p)
    p.set_defaults(factor_required=factor_required)
    add_original_context_arg(p)
    p.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a method parameter, repeatable (e.g. --param beta_fast=32 --param attention_factor=1.0)",
    )
    add_shipped_args(p)
    p.add_argument(
        "--sliding-window",
        type=typed(options.sliding_window, "--sliding-window"),
        default="keep",
        metavar="keep|none|N",
        help="Mistral-style sliding window: keep it (default), none (full attention) or a width",
    )


def add_shipped_args(p: argparse.ArgumentParser) -> None:
    """``--compose`` / ``--replace`` (what a new scaling does with the one the checkpoint ships with) and
    ``--shipped-context N`` (the context it serves as shipped, where config.json and the family table
    are wrong): :mod:`ropescale.patching.shipped`."""
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--replace",
        action="store_true",
        help="replace the checkpoint's own scaling, starting from its pretraining frequencies and context "
        "(the saved method and factor with no --param keep the saved parameters)",
    )
    group.add_argument(
        "--compose",
        action="store_true",
        help="build on the checkpoint's own scaling, from its shipped context (the default where its weights "
        "were trained with it: Llama 3.1, a ropescale fine-tune)",
    )
    add_shipped_context_arg(p)


def add_shipped_context_arg(p: argparse.ArgumentParser) -> None:
    """``--shipped-context N``: the context the checkpoint serves as shipped, where its config.json and the
    family table are wrong (:func:`ropescale.patching.shipped.shipped_of`)."""
    p.add_argument(
        "--shipped-context",
        type=_length,
        default=None,
        metavar="N",
        help="the context the checkpoint serves as shipped, where its config.json and the family table are wrong",
    )


def add_factor_args(p: argparse.ArgumentParser) -> None:
    """``--factor S`` or ``--target-length N`` (factor = N / original context, see
    :mod:`ropescale.methods.factor`); giving both is a usage error."""
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--factor", type=typed(options.factor), default=None, help="scaling factor s: extended context = s × original"
    )
    group.add_argument(
        "--target-length",
        type=_length,
        default=None,
        metavar="N",
        help="the context to reach instead of --factor: factor = N / original context "
        "(rounded up to an integer for llama3)",
    )


#: ``type=`` for counts ("expected a positive integer, got '0'")
_positive_int = typed(options.positive_int)
#: ``type=`` for lengths in tokens: 4096 or 4k (1k = 1024)
_length = typed(options.length)


#: a ``--param KEY=VALUE`` value as YAML reads it (``32``, ``1e4``, ``[1, 2]``, ``keep``); the keys are the
#: chosen method's parameter names, which its dataclass checks once the method is known
ParamValue = str | int | float | bool | None | list["ParamValue"] | dict[str, "ParamValue"]


class ScalingKwargs(TypedDict):
    """:func:`scaling_kwargs`: the scaling flags as keyword arguments (lm-eval's ``model_args`` pass them on)."""

    method: str
    factor: float | None
    target_length: int | None
    original_max_position_embeddings: int | None
    replace: bool
    sliding_window: str | int | None  # "keep", None (full attention) or a width
    params: dict[str, ParamValue]


def parse_params(items: list[str]) -> dict[str, ParamValue]:
    """``["beta_fast=32", "long_factor=[1,2]"]`` → ``{"beta_fast": 32, "long_factor": [1, 2]}``."""
    return options.key_values(items, "--param")


def parse_sliding_window(text: Any) -> Any:
    """``keep`` / ``none`` / a width (see :func:`ropescale.options.sliding_window`)."""
    return options.sliding_window(text, "--sliding-window")


def scaling_from_args(args: argparse.Namespace, check: bool = True) -> Scaling:
    """The one :class:`~ropescale.scaling.Scaling` of the parsed scaling flags (``add_scaling_args``),
    checked (:meth:`~ropescale.scaling.Scaling.check`): a wrong method or parameter fails here, before any
    model is resolved, and the method object that passed is the one the plan uses. ``check=False``: a
    command that says what is wrong with its own words first (``lm-eval``) checks it later."""
    from ropescale.scaling import Scaling

    params = parse_params(args.param)
    for reserved in ("factor", "method", "target_length"):
        if reserved in params:
            raise ValueError(f"give {reserved} with --{reserved.replace('_', '-')}, not --param")
    target_length = getattr(args, "target_length", None)
    if getattr(args, "factor_required", False) and args.factor is None and target_length is None:
        raise ValueError("the following arguments are required: --factor (or --target-length)")
    scaling = Scaling.of(
        args.method,
        args.factor,  # a float (argparse type); its range is the method's check
        args.original_max_position_embeddings,
        args.replace,
        parse_sliding_window(args.sliding_window),
        target_length=target_length,  # resolved to a factor by the plan once the model's context is known
        **params,
        **({"compose": True} if getattr(args, "compose", False) else {}),
        **({"shipped_context": args.shipped_context} if getattr(args, "shipped_context", None) else {}),
    )
    return scaling.checked() if check else scaling


def scaling_kwargs(args: argparse.Namespace) -> ScalingKwargs:
    """The keyword form of :func:`scaling_from_args` (lm-eval's ``model_args`` are text: they pass it on)."""
    s = scaling_from_args(args, check=False)
    return {
        "method": args.method,
        "factor": s.factor,
        "target_length": s.target_length,
        "original_max_position_embeddings": s.original_context,
        "replace": s.replace,
        "sliding_window": s.sliding_window,
        "params": s.method_params(),
    }


def check_output_dir(path: str, overwrite: bool, inputs: dict[str, object] | None = None) -> Path:
    """Fail early (before loading any weights) if ``path`` cannot be written.

    With ``overwrite``, a non-empty ``path`` is replaced only if it is none of ``inputs`` (nor holds
    or lies inside one, symlinks resolved) and looks like a checkpoint ropescale wrote (its
    config.json carries the ``ropescale`` block): a stranger's folder is refused, not deleted.
    """
    out = Path(path).expanduser()
    if out.exists() and not out.is_dir():
        raise RopescaleError(f"output '{path}' exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise RopescaleError(f"output directory '{path}' is not empty (use --overwrite to replace it)")
    if out.is_dir() and any(out.iterdir()):
        from ropescale._lock import refuse_overwriting_inputs

        refuse_overwriting_inputs(path, inputs or {})
        if not written_by_ropescale(out):
            raise RopescaleError(
                f"output directory '{path}' does not look like a checkpoint ropescale wrote (no config.json with "
                'a "ropescale" block); --overwrite replaces only those: remove it yourself or choose another'
            )
    parent = out.parent
    while not parent.exists():
        parent = parent.parent
    if not os.access(parent, os.W_OK):
        raise RopescaleError(f"output '{path}' is not writable")
    try:
        tempfile.TemporaryFile(dir=parent).close()
    except OSError as exc:
        raise RopescaleError(f"output '{path}' is not writable: {exc.strerror}") from None
    return out


def unit_floats(flag: str, text: str) -> list[float]:
    """``"0.2,0.5"`` -> ``[0.2, 0.5]``: comma-separated numbers in [0, 1] (e.g. needle depths)."""
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{flag} must be comma-separated numbers, got {text!r}") from None
    if not values or any(not 0 <= v <= 1 for v in values):
        raise ValueError(f"{flag} must be numbers in [0, 1], got {text!r}")
    return values


def written_by_ropescale(folder: Path) -> bool:
    """Whether ``folder`` holds a checkpoint ropescale saved: its config.json has the provenance block."""
    import json

    try:
        return isinstance(json.loads((folder / "config.json").read_text(encoding="utf-8")).get("ropescale"), dict)
    except (OSError, ValueError, AttributeError):
        return False


def model_slug(model: str) -> str:
    """A model name or path as one file or folder name (``./models/y4`` → ``models-y4``): the default
    outputs of ``eval`` and ``plot`` are named by it."""
    import re

    return re.sub(r"[^A-Za-z0-9_.-]+", "-", str(model)).strip("-.") or "model"
