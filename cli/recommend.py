"""``ropescale recommend``: which method and factor for a target length, why, and what to run."""

from __future__ import annotations

import argparse

from ropescale.cli.command import Command
from ropescale.cli.common import _length, add_model_args, add_original_context_arg, add_shipped_args

EXAMPLES = """examples:
  ropescale recommend --target-length 32768                    # embedded SmolLM2-135M, 8k -> 32k
  ropescale recommend --model ./llama-2-7b --target-length 65536 --budget fine-tune
  ropescale recommend --target-length 16384 --results runs/smollm2-x4
  ropescale recommend --target-length 32768 --verbose           # + reasons, trade-offs, evidence
  ropescale recommend --target-length 32768 --serve-with vllm   # only what vLLM serves from the saved model
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    p.add_argument("--target-length", type=_length, required=True, metavar="N", help="the context to reach, in tokens")
    p.add_argument(
        "--budget",
        default="auto",
        choices=["auto", "training-free", "fine-tune"],
        help="auto (default): training-free up to 8x the trained context, fine-tune beyond",
    )
    p.add_argument(
        "--results",
        action="append",
        default=None,
        metavar="PATH",
        help="results.json (or its folder) to draw the trade-offs from, or a folder of `ropescale eval ruler` "
        "(the battery: line), repeatable (default: runs/*/results.json and benchmarks/results/*.json here; the "
        "RULER cells shipped in evals/measured/ruler/)",
    )
    p.add_argument(
        "--serve-with",
        default=None,
        metavar="ENGINE",
        help="recommend only methods this engine serves from the checkpoint `ropescale patch` saves, as "
        "`ropescale doctor` judges it: transformers, transformers4, transformers5, vllm, sglang, tgi, llama.cpp, "
        "a row of `ropescale doctor` (vllm-0.30) or a version (vllm==0.33.0)",
    )
    detail = p.add_mutually_exclusive_group()
    detail.add_argument(
        "--verbose",
        action="store_true",
        help="add every reason, the measured trade-offs, the evidence tables and the commands that measured them",
    )
    detail.add_argument("--json", action="store_true", help="print the whole recommendation as JSON")
    add_original_context_arg(p)
    add_shipped_args(p)


def run(args: argparse.Namespace) -> int:
    import importlib.util

    from ropescale.evals.advice.evidence import find_evidence
    from ropescale.evals.advice.recommend import recommend
    from ropescale.evals.advice.recommend_text import format_recommendation, format_short, to_record
    from ropescale.models.loading import load_config
    from ropescale.patching.plan import is_scaled, plan_patch

    # an engine it does not know, a --results file it cannot read: named here, before the model is resolved
    engines = None
    if args.serve_with is not None:
        from ropescale.evals.advice.serving import engines_for

        engines = engines_for(args.serve_with)
    from ropescale.evals.advice.battery_evidence import battery_folders, is_battery

    ruler = [p for p in args.results or [] if is_battery(p)]
    evidence = find_evidence(args.model, [p for p in args.results or [] if p not in ruler] or None)
    battery = battery_folders(args.model, ruler)
    config = load_config(args.model, args.original_max_position_embeddings)
    # the original geometry, also for an already scaled checkpoint
    spec = plan_patch(config, "default", None, args.original_max_position_embeddings, replace=True).spec
    start = _start(args, config)  # (the context the factor is measured from, flags, the line that says why)
    if start is None:
        return 0  # within the shipped context: said, nothing to scale
    context, shipped_flags, start_line = start
    recipe = (
        _pose_recipe(args.model, args.target_length / context, args.target_length)
        if importlib.util.find_spec("ropescale.cli.train")
        else None
    )
    serving = None
    if engines is not None:
        from ropescale.evals.advice.serving import Serving

        serving = Serving(args.serve_with, engines, config, args.original_max_position_embeddings, is_scaled(config))
    rec = recommend(
        args.model,
        context,
        args.target_length,
        args.budget,
        evidence=evidence,
        train_recipe=recipe,
        # the printed patch commands reach the same factor: they carry the trained context given here
        patch_flags=shipped_flags
        + (
            f" --original-max-position-embeddings {args.original_max_position_embeddings}"
            if args.original_max_position_embeddings
            else ""
        ),
        serving=serving,
        battery=battery,
    )
    rec.starts = start_line
    rec.commands = [(what, _as_shipped_recipe(cmd, rec.commands)) for what, cmd in rec.commands]
    rec.commands = [_as_the_family_trains(what, cmd, recipe, rec.factor) for what, cmd in rec.commands]
    rec.commands = [_as_written(what, cmd, recipe, args.target_length) for what, cmd in rec.commands]
    rec.commands = [(what, _without_recipe_settings(cmd)) for what, cmd in rec.commands]
    if args.json:
        import json

        print(json.dumps(to_record(rec), indent=2, ensure_ascii=False, default=str))
    else:
        print(format_recommendation(rec, spec) if args.verbose else format_short(rec))
    return 0


def _start(args: argparse.Namespace, config) -> tuple[int, str, str] | None:
    """On a checkpoint that arrives already extended: None (printed: already covered) for a target within its
    shipped context; else the context the factor is measured from (the shipped one when composing, the
    pretraining one when replacing), the flag the printed commands carry and the line that says which
    (ropescale.patching.shipped). On plain RoPE: the pretraining context, no flag, the line naming its source."""
    from ropescale.patching.plan import is_scaled
    from ropescale.patching.readback import scaling_label
    from ropescale.patching.shipped import COMPOSE, shipped_of, start_mode

    shipped = shipped_of(config, args.shipped_context, args.original_max_position_embeddings)
    if not is_scaled(config):
        return (
            shipped.pretraining,
            "",
            f"from the pretraining context {shipped.pretraining} ({shipped.pretraining_source})",
        )
    label = scaling_label(shipped.scaling or {})
    if args.target_length <= shipped.context and not args.replace:
        print(
            f"recommendation:  none needed: {args.model} serves {shipped.context:,} tokens as shipped ({label}; "
            f"{shipped.context_source}), {args.target_length:,} included\n"
            f"check it:\n  ropescale eval passkey --model {args.model} --lengths {args.target_length}   # its saved "
            "scaling\n"
            f"beyond it:  ropescale recommend --model {args.model} --target-length {2 * shipped.context}"
        )
        return None
    mode = start_mode(shipped, args.compose or None, args.replace or None, args.model)
    if mode == COMPOSE:
        why = "trained with it" if shipped.trained else "--compose"
        line = f"on top of the shipped {label} ({why}: {shipped.trained_source}), from {shipped.context:,} ({shipped.context_source})"
        return shipped.context, " --compose", line
    why = "applied without training" if shipped.trained is False else "--replace"
    line = (
        f"replacing the shipped {label} ({why}: {shipped.trained_source}), from the pretraining {shipped.pretraining:,}"
    )
    return shipped.pretraining, " --replace", line


def _family(name: str) -> str:
    """A model or recipe-folder name reduced to compare families: lower case, letters and digits only, a
    leading ``meta`` dropped (``meta-llama/Meta-Llama-3-8B-Instruct`` and ``llama3-8b`` both start ``llama38b``)."""
    import re

    key = re.sub(r"[^a-z0-9]", "", name.rsplit("/", 1)[-1].lower())
    return key[4:] if key.startswith("meta") else key


def _reach(path) -> int | None:
    """The context a recipe written for an already extended checkpoint (one that sets
    ``model.shipped_scaling``) trains for: its PoSE target, else its windows; None for any other recipe
    (the factor-based choice applies to those) or one that does not load."""
    try:
        from ropescale.training.config import load_config

        c = load_config(str(path))
    except Exception:  # noqa: BLE001 - a recipe that does not load is not a candidate
        return None
    if not c.model.shipped_scaling:
        return None
    return int(c.pose.target_length) if c.pose.enabled and c.pose.target_length else int(c.data.seq_len)


def _pose_recipe(model: str, factor: float | None = None, target: int | None = None) -> str:
    """A shipped recipe to start from (``configs/train/``): the model family's own — the recipe folder whose
    name the model's name starts with, the longest such (``Mistral-7B-v0.3`` takes ``mistral-7b-v0.3``, not
    ``mistral-7b``) — at the factor asked for where the family has one (``yarn_x8`` for ×8); otherwise a PoSE
    recipe of another family, which the printed command points at the model."""
    from pathlib import Path

    try:
        from ropescale.training.config import CONFIGS_DIR
    except ImportError:
        return "<recipe.yaml>"
    recipes = sorted(CONFIGS_DIR.rglob("*pose*.yaml"))
    name = _family(Path(model).name if Path(model).exists() else model)
    folders = [d for d in CONFIGS_DIR.iterdir() if d.is_dir() and name.startswith(_family(d.name))]
    folder = max(folders, key=lambda d: len(_family(d.name)), default=CONFIGS_DIR / Path(model).name)
    # the family's own: the extension recipes (yarn_x*; the factor asked for first), then its PoSE recipes
    # (a context-parallel recipe ends in _cp; the CPU-sized ones, _cpu, are candidates like any other)
    own = sorted(r for r in folder.glob("yarn_x*.yaml") if "control" not in r.stem and not r.stem.endswith("_cp"))
    if factor:  # the factor's own recipe, then its variants (yarn_x2_cpu for x2); stable: the rest keep their order
        exact = f"yarn_x{factor:g}"
        own.sort(key=lambda r: (r.stem != exact, not r.stem.startswith(exact + "_")))
    # a family recipe that reaches the target itself (llama3.1-8b/ultralong_yarn_x64_512k for 512k) comes first
    reaching = [r for r in sorted(folder.glob("*.yaml")) if target and _reach(r) == target and "control" not in r.stem]
    own = reaching + [r for r in own if r not in reaching]
    own += [r for r in recipes if r.parent == folder]
    pick = (own or recipes or [None])[0]
    return str(pick.relative_to(CONFIGS_DIR).with_suffix("")) if pick else "<recipe.yaml>"


def _as_shipped_recipe(command: str, commands: list[tuple[str, str]]) -> str:
    """``command`` (the fine-tune keeping retrieval: a recipe, the target's keys and the variant's overrides)
    as the shipped recipe beside it that trains exactly that (every setting equal but the run's name and
    folder), with the target's keys only; ``command`` itself where none does, or for any other command."""
    import shlex
    from pathlib import Path

    from ropescale.errors import RopescaleError
    from ropescale.training.config import CONFIGS_DIR, load_config

    base = dict(commands).get("fine-tune (PoSE)", "")
    if not (command.startswith("ropescale train --config ") and base.startswith("ropescale train --config ")):
        return command
    try:  # a model path the shell would not read back: leave the command as printed
        words, keys = shlex.split(command), shlex.split(base)[4:]
    except ValueError:
        return command
    if words[4:] == keys:
        return command

    def trains(recipe: str, overrides: list[str]) -> dict:
        d = load_config(recipe, overrides).to_dict()
        d.pop("name", None)
        d["train"].pop("output_dir", None)
        return d

    try:
        asked = trains(words[3], words[4:])
    except RopescaleError:
        return command
    for path in sorted((CONFIGS_DIR / Path(words[3]).parent).glob("*.yaml")):
        name = str(path.relative_to(CONFIGS_DIR).with_suffix(""))
        try:
            if name != words[3] and trains(name, keys) == asked:
                return shlex.join(["ropescale", "train", "--config", name, *keys])
        except RopescaleError:  # a recipe that does not take the keys is not this one
            continue
    return command


def _trains(recipe: str, overrides: list[str]) -> dict:
    """What a recipe with overrides trains: every setting but the run's name and folder."""
    from ropescale.training.config import load_config

    d = load_config(recipe, overrides).to_dict()
    d.pop("name", None)
    d["train"].pop("output_dir", None)
    return d


def _without_recipe_settings(command: str) -> str:
    """A ``ropescale train --config R KEY=VALUE...`` command without the overrides that say what ``R``
    already sets (``model.name=smollm2-135m`` on a recipe for that model): each override's value, read as
    the training config loader reads it, against the value the loaded recipe has at that key (its
    defaults included), so what is printed is only what differs, also where the overrides together would
    not validate (a target shorter than the recipe's windows: ``ropescale train`` says so itself). Any
    other command as it is."""
    import shlex

    from ropescale.errors import RopescaleError
    from ropescale.training.config import apply_overrides

    if not command.startswith("ropescale train --config "):
        return command
    try:
        words = shlex.split(command)
        recipe, overrides = words[3], words[4:]
        base = _trains(recipe, [])
    except (ValueError, RopescaleError):  # a path the shell cannot read back, or a recipe that does not load
        return command

    def sets(override: str) -> bool:
        try:
            given = apply_overrides({}, [override])
        except RopescaleError:  # not an override the loader reads: leave it for `ropescale train` to name
            return False
        ((section, value),) = given.items()
        if not isinstance(value, dict):
            return False  # the run's name is not a training setting (nor in base)
        ((key, value),) = value.items()
        return key in base.get(section, {}) and base[section][key] == value

    return shlex.join([*words[:4], *(o for o in overrides if not sets(o))])


def _as_written(what: str, command: str, recipe: str | None, target: int) -> tuple[str, str]:
    """The fine-tune command on a family recipe written for exactly this target (UltraLong's 512k/1M): the
    recipe as written, on the user's model, its scaling overrides dropped (they would re-measure its factor
    from another context), labelled with what it does to the shipped scaling (``model.shipped_scaling``)."""
    import shlex

    from ropescale.errors import RopescaleError

    if not recipe or not command.startswith(f"ropescale train --config {recipe} ") or _reach(recipe) != target:
        return what, command
    try:
        words = shlex.split(command)
        kept = [w for w in words[4:] if w.startswith("model.name=")]
        shipped = _trains(recipe, kept)["model"].get("shipped_scaling")
    except (ValueError, RopescaleError, KeyError):
        return what, command
    if not shipped:  # a recipe for plain-RoPE checkpoints: the factor-based commands above apply
        return what, command
    label = what.split(" (")[0] + f" (its family's recipe for {target:,}; {shipped}s the shipped scaling)"
    return label, shlex.join([*words[:4], *kept])


def _as_the_family_trains(what: str, command: str, recipe: str | None, factor: float) -> tuple[str, str]:
    """The fine-tune command on a family's own recipe at the factor asked for (``llama3-8b/yarn_x8`` for
    ×8): the recipe's own windows (full or PoSE, as written for that family) rather than PoSE forced on
    them; labelled by what it then does. Any other command as it is."""
    import shlex
    from pathlib import Path

    from ropescale.errors import RopescaleError

    if (
        not recipe
        or Path(recipe).name != f"yarn_x{factor:g}"
        or not command.startswith(f"ropescale train --config {recipe} ")
    ):
        return what, command
    try:
        words = shlex.split(command)
        kept = [w for w in words[4:] if not w.startswith("pose.")]
        pose = _trains(recipe, kept)["pose"]["enabled"]
    except (ValueError, RopescaleError, KeyError):
        return what, command
    label = what.replace("fine-tune (PoSE)", "fine-tune (PoSE)" if pose else "fine-tune (full windows)")
    return label, shlex.join([*words[:4], *kept])


COMMAND = Command(
    "recommend",
    help="recommend a scaling method and factor for a target context length",
    description="Recommend a method and parameters to reach a target context: training-free or with a "
    "fine-tune, the reasons, the trade-offs measured in evaluation results (runs/*/results.json for the same "
    "model, then the SmolLM2-135M measurements shipped with ropescale, each with the command that produced "
    "it), and the commands to run. Only the "
    "model's config is read.",
    add_arguments=add_arguments,
    run=run,
    epilog=EXAMPLES,
    raw=True,
)
