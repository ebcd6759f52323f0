"""``ropescale export-gguf``: write a (patched) Llama/Mistral/Qwen2/Qwen3 checkpoint as a GGUF file for llama.cpp."""

from __future__ import annotations

import argparse

from ropescale.cli.command import Command
from ropescale.cli.common import add_factor_args, parse_params, parse_sliding_window

EXAMPLES = """examples:
  ropescale export-gguf ./smollm2-yarn4 --output smollm2-yarn4.gguf             # a checkpoint saved by ropescale patch
  ropescale export-gguf smollm2-135m --method yarn --factor 4 --output s.gguf   # patch on the fly
  ropescale export-gguf ./llama --output llama-q8.gguf --dtype q8_0
  llama-cli -m smollm2-yarn4.gguf -c 32768 ...                                  # no rope flags needed

llama.cpp runs static scalings only: default, linear, ntk, yarn (beta_fast=32, beta_slow=1), and on
Llama/Mistral llama3 and longrope (per-dimension factors; Qwen2/Qwen3 take none). dynamic_ntk,
dynamic_yarn, self_extend and kv_consistent are refused; `ropescale doctor` gives the same answer.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", help="checkpoint directory or embedded model name (smollm2-135m)")
    p.add_argument("--output", required=True, metavar="FILE", help="the .gguf file to write")
    p.add_argument(
        "--dtype",
        default="f16",
        choices=["f32", "f16", "q8_0"],
        help="matrices in f32, f16 (default) or q8_0; norms and rope tensors stay f32",
    )
    p.add_argument(
        "--method", default=None, help="patch with this method before exporting (default: the checkpoint's own scaling)"
    )
    add_factor_args(p)
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="a method parameter, repeatable")
    p.add_argument("--replace", action="store_true", help="with --method: replace an existing scaling")
    p.add_argument(
        "--sliding-window",
        default="keep",
        metavar="keep|none|N",
        help="with --method: Mistral's sliding window (llama.cpp needs none or one >= the context)",
    )
    p.add_argument(
        "--tokenizer-pre",
        default=None,
        metavar="NAME",
        help="llama.cpp pre-tokenizer name, when it cannot be read off the tokenizer (e.g. llama-bpe)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing output file")


def run(args: argparse.Namespace) -> int:
    from ropescale.export import export_gguf

    params = parse_params(args.param)
    patching = {
        "factor": args.factor,
        "target_length": args.target_length,
        "replace": args.replace or None,
        "sliding_window": None if args.sliding_window == "keep" else args.sliding_window,
        **params,
    }
    given = [k for k, v in patching.items() if v is not None]
    if args.method is None and given:
        raise ValueError(f"--{given[0].replace('_', '-')} needs --method (it patches the model before exporting)")
    kwargs = {}
    if args.method is not None:
        kwargs = {
            "method": args.method,
            "factor": args.factor,
            "replace": args.replace,
            "sliding_window": parse_sliding_window(args.sliding_window),
            **params,
        }
        if args.target_length is not None:
            kwargs["target_length"] = args.target_length
    from pathlib import Path

    from ropescale._lock import output_lock

    if Path(args.output).expanduser().is_dir():  # refused before anything is converted or loaded
        raise ValueError(f"--output '{args.output}' is a directory; give the .gguf file to write")
    if args.overwrite:  # the model file (or a link to it) is never the file replaced
        from ropescale._lock import refuse_overwriting_inputs

        refuse_overwriting_inputs(args.output, {"model": args.model}, replaced_inside=False)
    with output_lock(args.output, folder=False):
        path = export_gguf(
            args.model, args.output, args.dtype, pre_tokenizer=args.tokenizer_pre, overwrite=args.overwrite, **kwargs
        )
    print(f"wrote {path} ({path.stat().st_size / 2**20:.0f} MiB, {args.dtype}): {rope_summary(path)}")
    return 0


def rope_summary(path) -> str:
    """The rope keys of a written file, one line (``type=yarn factor=4 ...``)."""
    import gguf

    reader = gguf.GGUFReader(path)
    parts = []
    for key, f in reader.fields.items():
        if ".rope." in key:
            value = f.contents()
            parts.append(
                f"{key.split('.rope.', 1)[1]}={value:g}"
                if isinstance(value, float)
                else f"{key.split('.rope.', 1)[1]}={value}"
            )
    parts += [f"{t.name}[{t.shape[0]}]" for t in reader.tensors if t.name.startswith("rope_")]
    return " ".join(parts)


COMMAND = Command(
    "export-gguf",
    help="write a checkpoint with its RoPE scaling as a GGUF file that llama.cpp runs without rope flags",
    description="Export a Llama, Mistral, Qwen2 or Qwen3 checkpoint (a ropescale-saved or plain transformers "
    "directory, or an embedded model name) to GGUF with llama.cpp's rope metadata. With --method, patch it first.",
    add_arguments=add_arguments,
    run=run,
    epilog=EXAMPLES,
    raw=True,
)
