"""``ropescale plot``: a PNG of per-pair RoPE wavelengths before and after each method."""

from __future__ import annotations

import argparse

from ropescale.cli.command import Command
from ropescale.cli.common import add_factor_args, add_model_args, add_original_context_arg, model_slug, parse_params

EXAMPLES = """examples:
  ropescale plot --methods linear,ntk,yarn,llama3 --factor 4 --output freq.png
  ropescale plot --model ./llama-2-7b --methods yarn,dynamic_ntk --target-length 32768
  ropescale plot --methods yarn --factor 8 --param beta_fast=16 --metric rotations
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    p.add_argument(
        "--methods",
        default="linear,ntk,yarn,llama3",
        help="comma-separated methods (default: linear,ntk,yarn,llama3); dynamic ones are drawn at "
        "the extended context",
    )
    add_factor_args(p)
    p.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a method parameter, given to every listed method that has it (e.g. beta_fast=16)",
    )
    p.add_argument(
        "--metric",
        default="wavelength",
        choices=["wavelength", "rotations"],
        help="y axis: wavelength in tokens (default) or full turns over the original context",
    )
    add_original_context_arg(p)
    p.add_argument(
        "--output",
        default=None,
        metavar="PNG",
        help="where to write the PNG (default: <model>-rope-<metric>.png in the current folder)",
    )


def run(args: argparse.Namespace) -> int:
    from ropescale.methods import method_class
    from ropescale.models.loading import load_config
    from ropescale.patching.plan import plan_patch
    from ropescale.plots.frequencies import plot_frequencies

    names = [m.strip() for m in args.methods.split(",") if m.strip()]
    if not names:
        raise ValueError("--methods needs at least one method, e.g. linear,ntk,yarn")
    classes = [method_class(n) for n in names]  # unknown names fail here, before any loading
    seen = set()
    for cls in classes:
        if cls.name in seen:
            raise ValueError(f"method '{cls.name}' is listed twice in --methods")
        seen.add(cls.name)
    scaling = [cls for cls in classes if cls.name != "default"]  # plain RoPE is always drawn
    if scaling and args.factor is None and args.target_length is None:
        raise ValueError("the following arguments are required: --factor (or --target-length)")
    params = parse_params(args.param)
    for key in ("factor", "method", "target_length"):
        if key in params:
            raise ValueError(f"give {key} with --{key.replace('_', '-')}, not --param")
    unused = sorted(k for k in params if not any(k in cls.parameter_defaults() for cls in scaling))
    if unused:
        raise ValueError(f"no listed method has a parameter {unused[0]!r}")

    config = load_config(args.model, args.original_max_position_embeddings)
    plans = [
        plan_patch(
            config,
            cls.name,
            args.factor,
            args.original_max_position_embeddings,
            replace=True,
            target_length=args.target_length,
            **{k: v for k, v in params.items() if k in cls.parameter_defaults()},
        )
        for cls in scaling
    ]
    if plans:
        spec = plans[0].spec
    else:  # only "none": the original curve alone
        spec = plan_patch(config, "default", None, args.original_max_position_embeddings, replace=True).spec
    output = args.output or f"{model_slug(args.model)}-rope-{args.metric}.png"
    title = (
        f"{args.model}: RoPE {args.metric} per pair (head_dim {spec.head_dim}, base {spec.base:g}, "
        f"L = {spec.original_max_position_embeddings:,})"
    )
    from ropescale._lock import writing

    with writing(output, "plot"):  # a full disk or read-only folder: one line naming the file
        plot_frequencies(spec, [p.method for p in plans], output, metric=args.metric, title=title)
    print(output)
    return 0


COMMAND = Command(
    "plot",
    help="plot per-pair RoPE wavelengths before/after scaling methods (PNG)",
    description="Write a PNG of each rotary pair's wavelength (or turns over the original context) for "
    "plain RoPE and for each method, with the original and extended contexts and YaRN's kept / "
    "blended / interpolated bands. Only the model's config is read.",
    add_arguments=add_arguments,
    run=run,
    epilog=EXAMPLES,
    raw=True,
)
