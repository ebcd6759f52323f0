"""``ropescale eval harness`` and ``ropescale-lm-eval``: lm-evaluation-harness from the command line.

``ropescale eval harness`` loads and scales a model with ropescale and runs lm-eval tasks on it
(:func:`ropescale.evals.lm_eval.run_harness`). ``ropescale-lm-eval`` (also ``python -m
ropescale.cli.lm_eval``) is lm-eval's own CLI (``lm-eval run|ls|validate``) with the ``ropescale``
model registered and, unless ``--include_path`` is given, ropescale's task folder on the task path.
Nothing here imports lm-eval until a command runs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ropescale import options
from ropescale.cli.command import Command
from ropescale.cli.common import ParamValue, _length, add_model_args, add_scaling_args, typed
from ropescale.evals.tasks.saved import is_saved
from ropescale.models.runtime import DTYPES as RUNTIME_DTYPES

#: weights dtypes of the ``ropescale`` lm-eval model (``auto``: as stored)
DTYPES = ("auto", *RUNTIME_DTYPES)


EXAMPLES = """examples:
  ropescale eval harness --method yarn --factor 4 --tasks passkey_4k,passkey_16k --limit 5
  ropescale eval harness --model ./my-yarn-x4 --tasks ropescale_passkey --output runs/as-saved
  ropescale eval harness --model ./my-yarn-x4 --method none --tasks ropescale_passkey   # scaling removed
  ropescale eval harness --factor 4 --param attention_factor=1.0 --tasks passkey_16k
  ropescale eval harness --factor 4 --tasks niah_single_1 --limit 3 --metadata max_seq_lengths=[4096]

Without --method the checkpoint runs with the scaling it was saved with (saved); a method named replaces
it, starting from the original RoPE, and --method none removes it (the unscaled baseline). The output
says which (ropescale.scaling in the JSON, read back from the loaded model).
Tasks: passkey_2k/4k/8k/16k/32k/64k/128k and the group ropescale_passkey (2k-32k) from this package; any
lm-eval task (RULER's niah_single_1 works offline); more with --include-path. The model's
tokenizer is passed to the tasks as metadata (RULER and passkey size their prompts with it), and
RULER's max_seq_lengths defaults to [max length] (lm-eval's own default is [4096]).
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``harness``."""
    add_model_args(p)
    add_scaling_args(
        p,
        factor_required=False,
        default_method="saved",
        method_help="scaling method (see `ropescale methods`); default: saved, the scaling the checkpoint carries; "
        "a method named replaces it (none: the unscaled baseline, scaling removed)",
    )
    p.add_argument("--tasks", required=True, metavar="T1,T2", help="comma-separated task, group or tag names")
    p.add_argument(
        "--include-path",
        action="append",
        default=[],
        metavar="DIR",
        help="another folder of task YAMLs (repeatable; this package's tasks are always included)",
    )
    p.add_argument("--limit", default=None, metavar="N", help="documents per task (or a fraction below 1)")
    p.add_argument(
        "--output",
        default=None,
        metavar="PATH",
        help="write the results as JSON: a .json file, or a directory that receives results.json",
    )
    p.add_argument(
        "--max-length",
        type=_length,
        default=None,
        metavar="N",
        help="context limit given to lm-eval (default: the scaled context, factor x original)",
    )
    p.add_argument("--dtype", default="auto", choices=DTYPES, help="weights dtype (default: auto, as stored)")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:N or mps (default: cuda if available, else cpu)")
    p.add_argument(
        "--batch-size", type=typed(_batch_size), default="1", metavar="N|auto", help="lm-eval batch size (default 1)"
    )
    p.add_argument("--tokenizer", default=None, metavar="NAME", help="tokenizer to use instead of the model's")
    p.add_argument(
        "--metadata",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="task metadata, repeatable or one JSON object (e.g. max_seq_lengths=[4096] for RULER)",
    )
    p.add_argument(
        "--gen-kwargs",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="generation overrides for generate_until tasks, repeatable (e.g. max_gen_toks=32)",
    )
    p.add_argument("--log-samples", action="store_true", help="keep every document's prompt and output in the JSON")


def _batch_size(text: str) -> int | str:
    """lm-eval's batch size: a positive integer, or ``auto`` / ``auto:N``."""
    return text if str(text).startswith("auto") else options.positive_int(text, "--batch-size")


def _key_values(items: list[str], flag: str) -> dict[str, ParamValue]:
    return options.key_values(items, flag, allow_json=True)


def run(args: argparse.Namespace) -> int:
    from ropescale.cli.common import scaling_kwargs
    from ropescale.evals.lm_eval import format_results, results_path

    kw = scaling_kwargs(args)
    method = None if is_saved(kw["method"]) else str(kw["method"]).strip()  # None: the checkpoint as saved
    target_length = kw.get("target_length")  # --target-length, where the CLI has it
    given = kw["factor"] is not None or target_length is not None or kw["params"]
    if method is None and given:
        raise ValueError(
            "--factor/--target-length/--param need a --method: without one the checkpoint runs with the scaling it "
            "carries (saved)"
        )
    none = method is not None and method.lower() in ("none", "default")
    if none and given:
        raise ValueError("--factor/--target-length/--param given with --method none")
    if method is not None and not none and kw["factor"] is None and target_length is None:
        raise ValueError(f"--method {method} needs --factor (or leave --method out to evaluate the model as saved)")
    kw["replace"] = True  # a method named on a scaled checkpoint replaces its scaling (the output says so)
    from contextlib import nullcontext

    from ropescale._lock import output_lock

    with output_lock(args.output, "results", folder=False) if args.output else nullcontext():
        results = _harness(args, kw, method, target_length)
    print(format_results(results))
    if args.output:
        print(f"wrote {results_path(args.output)}")
    return 0


def _harness(args: argparse.Namespace, kw: dict, method: str | None, target_length: int | None):
    from ropescale.evals.lm_eval import run_harness

    return run_harness(
        args.model,
        args.tasks,
        method=method,
        factor=kw["factor"],
        original_max_position_embeddings=kw["original_max_position_embeddings"],
        replace=kw["replace"],
        sliding_window=kw["sliding_window"],
        method_params=kw["params"] or None,
        target_length=target_length,
        max_length=args.max_length,
        dtype=args.dtype,
        device=args.device,
        batch_size=args.batch_size,
        tokenizer=args.tokenizer,
        include_path=args.include_path or None,
        limit=args.limit,
        output_path=args.output,
        metadata=_key_values(args.metadata, "--metadata") or None,
        gen_kwargs=_key_values(args.gen_kwargs, "--gen-kwargs") or None,
        log_samples=args.log_samples,
    )


def main(argv: Sequence[str] | None = None) -> None:
    """``ropescale-lm-eval``: lm-eval's command line (``lm-eval run|ls|validate ...``) with
    ``ropescale`` registered and ropescale's tasks on the task path when ``--include_path`` is not given.

    Args:
        argv: the arguments (default: ``sys.argv[1:]``).
    """
    from ropescale.evals.lm_eval import TASKS_DIR, register_lm_eval_model
    from ropescale.evals.lm_eval.model import lm_eval_missing

    try:
        from lm_eval.__main__ import cli_evaluate
    except ImportError as exc:
        raise lm_eval_missing() from exc
    register_lm_eval_model()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and not {"-h", "--help"} & set(argv) and "--include_path" not in argv:
        argv += ["--include_path", str(TASKS_DIR)]
    sys.argv = [sys.argv[0] or "lm-eval", *argv]
    cli_evaluate()


COMMAND = Command(
    "harness",
    help="run lm-evaluation-harness tasks (passkey, RULER...) on a RoPE-scaled model",
    description="Load and scale a model with ropescale and evaluate it with lm-evaluation-harness. "
    "Prints lm-eval's tables; --output writes the results as JSON.",
    add_arguments=add_arguments,
    run=run,
    epilog=EXAMPLES,
    raw=True,
)


if __name__ == "__main__":
    main()
