"""``ropescale patch``: show or write a model with a RoPE scaling applied."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from pathlib import Path

from ropescale.cli.command import Command
from ropescale.cli.common import add_model_args, add_scaling_args, check_output_dir, scaling_from_args

EXAMPLES = """examples:
  ropescale patch --factor 4                                   # summary for the embedded SmolLM2-135M
  ropescale patch --model ./llama --method linear --factor 8 --output ./llama-pi8
  ropescale patch --target-length 32768                        # factor = 32768 / 8192 = 4
  ropescale patch --model org/name --factor 4 --param beta_fast=16 --output out --config-only
  ropescale patch --from-search runs/search-32k --output ./smollm2-32k        # the result of `ropescale search`
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_scaling_args(p, factor_required=False)  # not with --from-search; checked in _from_search
    p.add_argument(
        "--from-search",
        default=None,
        metavar="DIR",
        help="use the best configuration found by `ropescale search --output DIR` (method, factor, parameters)",
    )
    p.add_argument("--output", default=None, metavar="DIR", help="write the patched checkpoint here")
    p.add_argument("--config-only", action="store_true", help="with --output: write only the config")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --output directory")
    p.add_argument(
        "--verbose",
        action="store_true",
        help="without --output: add each rotary pair's wavelength before/after; with it: the table of loaders",
    )
    p.set_defaults(model=None, method=None)  # defaults resolved in _from_search


def run(args: argparse.Namespace) -> int:
    from ropescale.models.checkpoint import save_pretrained
    from ropescale.models.loading import from_pretrained, load_config, load_tokenizer
    from ropescale.patching.model import apply_plan
    from ropescale.patching.plan import plan_scaling

    _from_search(args)
    if args.config_only and not args.output:
        raise ValueError("--config-only needs --output")
    # checked: the method and its parameters fail here, before the model is resolved (an embedded one converted)
    scaling = scaling_from_args(args)
    inputs = {"model": args.model, "search results": args.from_search}  # what --overwrite must never delete
    with _output(args.output, args.overwrite, inputs) as out:
        config = load_config(args.model, scaling.original_context)
        plan = plan_scaling(config, scaling)  # the one plan: printed, or written (config alone or the checkpoint)
        if out is None:
            print(summary(args.model, plan, verbose=args.verbose))
            return 0
        from ropescale.cli.doctor import print_saved, saving_quietly

        if args.config_only:
            apply_plan(config, plan)
            with saving_quietly():
                save_pretrained(_ConfigHolder(config), out, config_only=True, overwrite=args.overwrite)
        else:
            model = from_pretrained(  # the plan made above is the one that writes the checkpoint
                args.model, original_max_position_embeddings=scaling.original_context, plan=plan
            )
            with saving_quietly():
                save_pretrained(
                    model, out, tokenizer=_maybe_tokenizer(load_tokenizer, args.model), overwrite=args.overwrite
                )
        what = plan.method.label() if hasattr(plan.method, "label") else f"{plan.method.name} x{plan.method.factor:g}"
        print(f"wrote {'config of ' if args.config_only else ''}{what} checkpoint to {out}")
        if plan.mode:  # what became of the scaling the checkpoint shipped with, said every time
            print(f"  {plan.start}")
        print_saved(out, verbose=args.verbose)  # which loaders keep the scaling: one line (the table: --verbose)
        return 0


@contextlib.contextmanager
def _output(output: str | None, overwrite: bool, inputs: dict[str, str | None]) -> Iterator[Path | None]:
    """The checked ``--output`` folder, held by its lock while the checkpoint is written (one writer per
    output; a second one stops here, naming this one); None without ``--output``."""
    if not output:
        yield None
        return
    from ropescale._lock import output_lock

    check_output_dir(output, overwrite, inputs)  # a clear line for an unwritable output, before the lock
    with output_lock(output):
        yield check_output_dir(output, overwrite, inputs)


def _from_search(args: argparse.Namespace) -> None:
    """Fill method, factor, parameters (and the model, unless given) from ``--from-search DIR``."""
    import json

    if not args.from_search:
        args.model = args.model or "smollm2-135m"
        args.method = args.method or "yarn"
        if args.factor is None and getattr(args, "target_length", None) is None:
            alternatives = "--target-length N, " if hasattr(args, "target_length") else ""
            raise ValueError(f"the following arguments are required: --factor (or {alternatives}--from-search DIR)")
        return
    given = [
        flag
        for flag, value in (
            ("--method", args.method),
            ("--factor", args.factor),
            ("--param", args.param),
            ("--target-length", getattr(args, "target_length", None)),
        )
        if value
    ]
    if given:
        raise ValueError(f"--from-search sets the method, factor and parameters; drop {', '.join(given)}")
    from ropescale.search import load_search

    result = load_search(args.from_search)
    args.model = args.model or result.model
    args.method, args.factor = result.method, result.params["factor"]
    args.param = [f"{k}={json.dumps(v)}" for k, v in result.params.items() if k != "factor"]


class _ConfigHolder:
    """Lets save_pretrained write a config alone."""

    def __init__(self, config):
        self.config = config


def _maybe_tokenizer(loader, model: str):
    try:
        return loader(model)
    except Exception:  # noqa: BLE001 - a checkpoint without a tokenizer is still a checkpoint
        return None


def summary(model: str, plan, verbose: bool = False) -> str:
    """The human-readable account of a patch plan: what changes first, one line per fact; with
    ``verbose`` each rotary pair's wavelength before and after (a sample of the pairs)."""
    from ropescale.patching.describe import pair_changes, sample_rows

    method, spec = plan.method, plan.spec
    extended = method.extended_context(spec)
    _, attention = method.compute(spec, extended)
    params = ", ".join(f"{k}={v}" for k, v in method.resolved_params(spec).items() if v is not None and k != "factor")
    native = "native rope_parameters" if plan.native else "ropescale rotary module (not expressible in transformers)"
    if plan.attention_mode == "kv_consistent":  # dynamic methods, LongRoPE's switch at L
        native += " + KV-consistent attention (cached keys follow the current frequencies; sdpa/eager)"
    what = method.label() if hasattr(method, "label") else method.name  # a composition names both scalings
    if hasattr(method, "label"):  # an attention-level method on top: its sizes, measured in the shipped context
        params = method.on_top_summary(spec)
    lines = [
        f"model:              {model}",
        f"method:             {what} (factor {method.factor:g}{', ' + params if params else ''})",
        f"rotary geometry:    head_dim {spec.head_dim}, rotary dim {spec.dim}, base {spec.base:g}",
        f"context:            {getattr(method, 'shipped_context', 0) or spec.original_max_position_embeddings} -> "
        f"{extended} tokens" + (" (dynamic: frequencies follow the current length)" if method.dynamic else ""),
        *([f"starts:             {plan.start}"] if plan.start else []),
        f"attention scaling:  {attention:.4f} on cos/sin (logits x{attention**2:.4f})"
        + (f" at {extended} tokens" if method.dynamic else ""),
        f"implemented by:     {native}",
    ]
    rows = pair_changes(method, spec, extended)
    counts = {s: sum(r.status == s for r in rows) for s in ("kept", "blended", "interpolated", "extrapolated")}
    pairs = ", ".join(f"{n} {s}" for s, n in counts.items() if n) + f" of {len(rows)} pairs"
    from ..attention import attention_target
    from ..methods.self_extend_llamacpp import llamacpp_note

    note = llamacpp_note(
        *attention_target(method, spec)
    )  # Self-Extend: the llama.cpp flags, and what llama.cpp computes
    tail = [note] if note else []
    if not verbose:
        return "\n".join([*lines, f"rotary pairs:       {pairs} (--verbose: each pair's wavelength)", *tail])
    lines += [
        "",
        f"per-pair wavelengths (tokens; L = {spec.original_max_position_embeddings}):",
        f"{'pair':>5} {'before':>12} {'after':>12} {'ratio':>7} {'turns in L':>11}  status",
    ]
    for r in sample_rows(rows):
        lines.append(
            f"{r.index:>5} {r.wavelength_before:>12.1f} {r.wavelength_after:>12.1f} "
            f"{r.wavelength_after / r.wavelength_before:>7.3f} {r.rotations_over_context:>11.2f}  {r.status}"
        )
    lines.append(f"  {pairs}")
    return "\n".join([*lines, *tail])


COMMAND = Command(
    "patch",
    help="apply a scaling method to a model: print a summary or write the patched checkpoint",
    description="Apply a RoPE scaling method. Without --output, print what it changes; with --output, "
    "write the patched checkpoint (weights, tokenizer, config) or only its config.",
    add_arguments=add_arguments,
    run=run,
    epilog=EXAMPLES,
    raw=True,
)
