"""``model.shipped_scaling``: what a recipe does with a scaling its checkpoint already carries.

Today's checkpoints often arrive extended: Llama-3.1 ships ``rope_type: llama3`` (factor 8, trained
at 8192, 131072 tokens), Qwen2.5 and Qwen3 document a training-free YaRN x4 switch from 32768. A
recipe that goes further either

* ``replace``: drops the shipped scaling and applies its own method to the *pretraining* frequencies
  from the pretraining context (UltraLong, arXiv 2504.06214: Llama-3.1-8B-Instruct's llama3 RoPE
  replaced by YaRN from 8192, factor 128 for 1M tokens, then continued pretraining), or
* ``compose``: applies its method on top of the shipped one, from the shipped context
  (:mod:`ropescale.methods.composed`).

The trainer never chooses silently and follows the one rule patch and recommend follow
(:func:`ropescale.patching.shipped.start_mode`): the recipe's ``model.shipped_scaling`` where it says;
else compose where the weights were trained with the shipped scaling (Llama 3.1, a ropescale fine-tune),
replace where it was switched on without training (Qwen's YaRN); where nothing says, it refuses in one
line naming ``model.shipped_scaling``, before any weights load. The dry run and the trainer print which.
"""

from __future__ import annotations

from typing import Any

from ..errors import AlreadyScaledError, RopescaleError

SHIPPED = ("replace", "compose")


def carried_scaling(hf_config: Any) -> str | None:
    """The scaling ``hf_config`` carries, in words (``llama3 x8: 8,192 -> 131,072 tokens``), or None."""
    from ..patching.plan import is_scaled, original_geometry, provenance

    if not is_scaled(hf_config):
        return None
    block = provenance(hf_config)
    rope = dict(getattr(hf_config, "rope_parameters", None) or {})
    kind = block["method"] if block else rope.get("rope_type", "?")
    factor = (block or {}).get("params", {}).get("factor") if block else rope.get("factor")
    L = original_geometry(hf_config)[2]
    extended = int((block or {}).get("extended_context") or hf_config.max_position_embeddings)
    size = f" x{float(factor):g}" if factor is not None else ""
    return f"{kind}{size}: {L:,} -> {extended:,} tokens"


def _is_the_recipes(config: Any, hf_config: Any) -> bool:
    """The checkpoint already carries exactly the recipe's scaling (a ropescale run's own output)."""
    from ..methods import get_method
    from ..patching.plan import provenance

    block = provenance(hf_config)
    if block is None:
        return False
    s = config.scaling
    wanted = get_method(s.method, factor=s.factor, **s.params)
    return block["method"] == wanted.name and block["params"] == wanted.params()


def _shipped(config: Any, hf_config: Any) -> Any:
    """The checkpoint as shipped, with the recipe's word on its contexts (``model.shipped_context``,
    ``scaling.original_max_position_embeddings``) over config.json and the family table."""
    from ..patching.shipped import shipped_of

    return shipped_of(hf_config, config.model.shipped_context, config.scaling.original_max_position_embeddings)


def shipped_mode(config: Any, hf_config: Any) -> str | None:
    """``replace`` or ``compose`` for a checkpoint that carries a scaling other than the recipe's (the
    recipe's word, else the rule), None where there is nothing to decide.

    Raises:
        RopescaleError: nothing says whether the weights were trained with the shipped scaling and the
            recipe does not set ``model.shipped_scaling`` (one line naming the key).
    """
    from ..patching.plan import is_scaled
    from ..patching.shipped import start_mode

    if not is_scaled(hf_config) or _is_the_recipes(config, hf_config):
        return None
    choice = config.model.shipped_scaling
    shipped = _shipped(config, hf_config)
    try:
        return start_mode(shipped, choice == "compose" or None, choice == "replace" or None)
    except AlreadyScaledError:
        rope_type = (getattr(hf_config, "rope_parameters", None) or {}).get("rope_type", "?")
        raise RopescaleError(
            f"rope_parameters.rope_type = '{rope_type}' ({carried_scaling(hf_config)}) is a scaling the checkpoint "
            "already carries, and nothing says whether its weights were trained with it: set "
            "model.shipped_scaling=compose to build on it or replace to start from the pretraining frequencies"
        ) from None


def shipped_scaling_line(config: Any, hf_config: Any, where: str = "config.json") -> str:
    """The line the dry run and the trainer print about the checkpoint's own scaling.

    Raises:
        RopescaleError: see :func:`shipped_mode` (the line names ``where``).
    """
    s = config.scaling
    choice = config.model.shipped_scaling
    recipe = f"{s.method} x{s.factor:g}"
    carried = carried_scaling(hf_config)
    try:
        mode = shipped_mode(config, hf_config)
    except RopescaleError as exc:
        raise RopescaleError(f"{where}: {exc}") from None
    if mode is None:
        what = "no scaling" if carried is None else f"the recipe's own scaling ({carried})"
        said = f" (model.shipped_scaling={choice})" if choice else ""
        return f"shipped:       {where} carries {what}; {recipe} applies to the pretraining frequencies{said}"
    rope_type = (getattr(hf_config, "rope_parameters", None) or {}).get("rope_type", "?")
    why = (
        "model.shipped_scaling=" + mode
        if choice
        else "the rule: " + ("trained with it" if mode == "compose" else "applied without training")
    )
    if mode == "compose":
        shipped = _shipped(config, hf_config)
        source = "model.shipped_context" if config.model.shipped_context else shipped.context_source
        return (
            f"shipped:       composed: {recipe} applies on top of rope_type '{rope_type}' of {where} ({carried}), "
            f"from its shipped context {shipped.context:,} as {source} gives it ({why})"
        )
    return (
        f"shipped:       replaced: rope_type '{rope_type}' of {where} ({carried}) is dropped; {recipe} applies to the "
        f"pretraining frequencies ({why})"
    )
