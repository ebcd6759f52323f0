"""``model.shipped_scaling``: what a recipe does with a scaling its checkpoint already carries.

Today's checkpoints often arrive extended: Llama-3.1 ships ``rope_type: llama3`` (factor 8, trained
at 8192, 131072 tokens), Qwen2.5 and Qwen3 document a training-free YaRN x4 switch from 32768. A
recipe that goes further either

* ``replace``: drops the shipped scaling and applies its own method to the *pretraining* frequencies
  from the pretraining context (UltraLong, arXiv 2504.06214: Llama-3.1-8B-Instruct's llama3 RoPE
  replaced by YaRN from 8192, factor 128 for 1M tokens, then continued pretraining), or
* ``compose``: applies its method on top of the shipped one.

The trainer never chooses silently. With ``replace`` it says what it drops; when the checkpoint's
``config.json`` carries a scaling other than the recipe's and the recipe does not say, it refuses in
one line naming ``model.shipped_scaling``, before any weights load. ``compose`` with a carried scaling
is refused too: ropescale's patching starts every method from the original frequencies, so composing
is not something this trainer can do yet.
"""

from __future__ import annotations

from typing import Any

from ..errors import RopescaleError

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


def shipped_scaling_line(config: Any, hf_config: Any, where: str = "config.json") -> str:
    """The line the dry run and the trainer print about the checkpoint's own scaling.

    Raises:
        RopescaleError: the checkpoint carries a scaling and ``model.shipped_scaling`` is not set, or is
            ``compose`` (one line naming the key).
    """
    s = config.scaling
    choice = config.model.shipped_scaling
    recipe = f"{s.method} x{s.factor:g}"
    carried = carried_scaling(hf_config)
    if carried is None or _is_the_recipes(config, hf_config):
        what = "no scaling" if carried is None else f"the recipe's own scaling ({carried})"
        said = f" (model.shipped_scaling={choice})" if choice else ""
        return f"shipped:       {where} carries {what}; {recipe} applies to the pretraining frequencies{said}"
    rope_type = (getattr(hf_config, "rope_parameters", None) or {}).get("rope_type", "?")
    if choice is None:
        raise RopescaleError(
            f"{where}: rope_parameters.rope_type = '{rope_type}' ({carried}) is a scaling the checkpoint already "
            f"carries; set model.shipped_scaling=replace to drop it and apply {recipe} to the pretraining frequencies, "
            "or compose to build on it"
        )
    if choice == "compose":
        raise RopescaleError(
            f"model.shipped_scaling=compose: {where} carries rope_type '{rope_type}' ({carried}), and ropescale "
            f"starts every scaling from the pretraining frequencies, so {recipe} cannot be put on top of it; "
            "set model.shipped_scaling=replace"
        )
    return (
        f"shipped:       replaced: rope_type '{rope_type}' of {where} ({carried}) is dropped; {recipe} applies to the "
        "pretraining frequencies (model.shipped_scaling=replace)"
    )
