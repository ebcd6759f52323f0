"""The model as shipped: the context a checkpoint serves, the context it was pretrained at, and whether
its weights were trained with the scaling it carries.

config.json alone does not say these reliably: Qwen3-8B states 40,960 for a model served at 32,768,
Qwen2-7B's base states 131,072 with no scaling, Mistral-Nemo states 1,024,000 for 128k, and Llama-3.2
carries llama3 ×32 (262,144 by the formula) yet serves 131,072. Each fact is taken, in this order, from
what the user says (``--shipped-context``, ``--original-max-position-embeddings``), ropescale's own
provenance block, :data:`FAMILIES` (released checkpoints recognised by their config, each row citing the
model card or report it comes from), and last ``max_position_embeddings``; :class:`Shipped` names the
source of each so every command can print it.

Whether the weights were trained with the shipped scaling decides what a new scaling starts from
(:func:`start_mode`): on top of it when they were (Llama 3.1's llama3 scaling, a ropescale fine-tune), from
the pretraining frequencies when the scaling was switched on without training (Qwen's YaRN switch, a
training-free ropescale patch). ``rope_type`` alone cannot tell (Yarn-Mistral-128k was trained with YaRN,
Qwen's YaRN is a switch): where neither a family row nor the provenance says, the user is asked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import AlreadyScaledError, RopescaleError
from ..methods.types import RopeParameters
from ..scaling import COMPOSE, REPLACE
from .geometry import CarriedScaling


@dataclass(frozen=True)
class Family:
    """A released family recognised by its config.json (``None`` in a field matches anything)."""

    name: str
    model_type: str
    rope_type: str
    theta: float | None
    max_position_embeddings: tuple[int, ...] | None
    factor: float | None
    original: int | None
    shipped_context: int
    pretraining_context: int
    trained: bool | None  # the weights were trained with the shipped scaling (None: plain RoPE)
    source: str

    def matches(self, model_type: str, rope: RopeParameters, field: int) -> bool:
        rope_type = str(rope.get("rope_type", "default"))
        theta = float(rope.get("rope_theta") or 0)
        checks = (
            self.model_type == model_type,
            self.rope_type == rope_type,
            self.theta is None or abs(self.theta - theta) < 1e-6 * self.theta,
            self.max_position_embeddings is None or field in self.max_position_embeddings,
            self.factor is None or float(rope.get("factor") or 0) == self.factor,
            self.original is None or int(rope.get("original_max_position_embeddings") or 0) == self.original,
        )
        return all(checks)


#: released checkpoints whose config.json does not say plainly what they serve or how they got there
FAMILIES: tuple[Family, ...] = (
    Family(
        "Llama 3.1/3.3",
        "llama",
        "llama3",
        500000.0,
        None,
        8.0,
        8192,
        131072,
        8192,
        True,
        "Meta's Llama 3.1 model cards (128k context) and arXiv 2407.21783 §3.4.2: pretrained at 8,192, "
        "then trained on long text with the llama3 frequencies",
    ),
    Family(
        "Llama 3.2",
        "llama",
        "llama3",
        500000.0,
        None,
        32.0,
        8192,
        131072,
        8192,
        True,
        "Meta's Llama 3.2 model cards (128k context; the config's llama3 x32 would give 262,144)",
    ),
    Family(
        "Qwen2/Qwen2.5 with the YaRN switch",
        "qwen2",
        "yarn",
        1000000.0,
        None,
        4.0,
        32768,
        131072,
        32768,
        False,
        "Qwen2.5 model cards: 32,768 tokens as configured, YaRN x4 added to config.json for 131,072 "
        "(static YaRN, switched on without training)",
    ),
    Family(
        "Qwen2/Qwen2.5",
        "qwen2",
        "default",
        1000000.0,
        (32768, 131072),
        None,
        None,
        32768,
        32768,
        None,
        "Qwen2.5 model cards and arXiv 2407.10671 (Qwen2): pretrained to 32,768; longer needs YaRN "
        "(some configs state 131,072)",
    ),
    Family(
        "Qwen3 with the YaRN switch",
        "qwen3",
        "yarn",
        1000000.0,
        None,
        4.0,
        32768,
        131072,
        32768,
        False,
        "Qwen3 model cards: 32,768 natively, 131,072 with YaRN x4 switched on in config.json (without training)",
    ),
    Family(
        "Qwen3",
        "qwen3",
        "default",
        1000000.0,
        (40960, 32768),
        None,
        None,
        32768,
        32768,
        None,
        "Qwen3 model cards: 32,768 tokens natively (config.json states 40,960)",
    ),
    Family(
        "Mistral-Nemo",
        "mistral",
        "default",
        1000000.0,
        (1024000,),
        None,
        None,
        131072,
        131072,
        None,
        "mistralai/Mistral-Nemo-Base-2407 model card: trained with a 128k context window (config.json "
        "states 1,024,000)",
    ),
    Family(
        "Mistral-7B-v0.1",
        "mistral",
        "default",
        10000.0,
        (32768,),
        None,
        None,
        8192,
        8192,
        None,
        "Mistral-7B-v0.1 (arXiv 2310.06825): trained at 8,192 (config.json states 32,768)",
    ),
)


@dataclass(frozen=True)
class Shipped:
    """What a checkpoint is as shipped, each fact with where it came from."""

    context: int  # L_s: the context it serves as shipped
    context_source: str
    pretraining: int  # L: the context its plain RoPE was pretrained at
    pretraining_source: str
    scaling: CarriedScaling | None  # {"method", "factor", "params"} it carries; None for plain RoPE
    trained: bool | None  # weights trained with that scaling; None: unknown (or plain)
    trained_source: str
    family: str | None = None

    def describe(self) -> str:
        """``shipped context 131072 (family table: Llama 3.1/3.3 ...); pretrained at 8192 (rope_parameters)``"""
        return (
            f"shipped context {self.context} ({self.context_source}); pretrained at {self.pretraining} "
            f"({self.pretraining_source})"
        )


def family_of(config: Any) -> Family | None:
    """The :data:`FAMILIES` row ``config`` matches, or None."""
    rope = dict(getattr(config, "rope_parameters", None) or {})
    rope.setdefault("rope_theta", getattr(config, "rope_theta", None))
    field = int(getattr(config, "max_position_embeddings", 0) or 0)
    model_type = str(getattr(config, "model_type", ""))
    return next((f for f in FAMILIES if f.matches(model_type, rope, field)), None)


def shipped_of(
    config: Any, shipped_context: int | None = None, original_max_position_embeddings: int | None = None
) -> Shipped:
    """Resolve a checkpoint's shipped and pretraining contexts and whether it was trained with its scaling.

    Args:
        config: the checkpoint's transformers config.
        shipped_context: ``--shipped-context``, the user's word for what it serves.
        original_max_position_embeddings: ``--original-max-position-embeddings``, the pretraining context.
    """
    from .geometry import carried, is_scaled, original_geometry, provenance

    block = provenance(config)
    family = None if block is not None else family_of(config)
    _, _, L = original_geometry(config)
    pre_source = "config.json max_position_embeddings"
    if block is not None:
        pre_source = "ropescale provenance"
    elif is_scaled(config) and "original_max_position_embeddings" in (config.rope_parameters or {}):
        pre_source = "config.json rope_parameters.original_max_position_embeddings"
    if family is not None and not is_scaled(config):
        L, pre_source = family.pretraining_context, f"family table: {family.name}"
    if original_max_position_embeddings is not None:
        L, pre_source = int(original_max_position_embeddings), "--original-max-position-embeddings"
    scaled = is_scaled(config)
    scaling = carried(config) if scaled else None
    trained, trained_source = None, "plain RoPE" if not scaled else "unknown"
    if block is not None and scaled:
        fine_tuned = bool(block.get("fine_tuned"))
        trained = fine_tuned
        trained_source = "ropescale provenance: " + ("a fine-tune (export)" if fine_tuned else "a training-free patch")
        context, source = int(block.get("extended_context") or config.max_position_embeddings), "ropescale provenance"
    elif family is not None:
        trained = family.trained if scaled else None
        trained_source = f"family table: {family.name}" if scaled else trained_source
        context, source = family.shipped_context, f"family table: {family.name}"
    else:
        context, source = int(config.max_position_embeddings), "config.json max_position_embeddings"
        if scaled and scaling and scaling.get("method") in ("dynamic_ntk", "dynamic_yarn"):
            context = int(round(float(scaling.get("factor") or 1) * L))  # dynamic rope keeps the field at L
    if shipped_context is not None:
        if isinstance(shipped_context, bool) or not isinstance(shipped_context, int) or shipped_context <= 0:
            raise ValueError(f"--shipped-context must be a positive integer, got {shipped_context!r}")
        context, source = int(shipped_context), "--shipped-context"
    if context < L:
        raise RopescaleError(
            f"shipped context {context} ({source}) is below the pretraining context {L} ({pre_source}); "
            "pass --shipped-context N or --original-max-position-embeddings N"
        )
    return Shipped(context, source, L, pre_source, scaling, trained, trained_source, family and family.name)


def start_mode(shipped: Shipped, compose: bool | None, replace: bool | None, what: str = "") -> str:
    """What a new scaling starts from on a scaled checkpoint: ``compose`` (on top of the shipped scaling,
    from the shipped context) or ``replace`` (from the pretraining frequencies and context).

    The user's ``--compose``/``--replace`` decide; else whether the weights were trained with the shipped
    scaling (:attr:`Shipped.trained`); where that is unknown, one line asks for the flag.
    """
    if compose and replace:
        raise ValueError("give --compose or --replace, not both")
    if compose:
        return COMPOSE
    if replace:
        return REPLACE
    if shipped.trained is True:
        return COMPOSE
    if shipped.trained is False:
        return REPLACE
    from .geometry import scaling_label

    carried = shipped.scaling or {}
    raise AlreadyScaledError(
        f"{what or 'the model'} ships with {scaling_label(carried)} and "
        "nothing says whether its weights were trained with it (no family row, no ropescale provenance): pass "
        "--compose to build on it (trained with it) or --replace to start from the pretraining frequencies"
    )


__all__ = ["COMPOSE", "FAMILIES", "REPLACE", "Family", "Shipped", "family_of", "shipped_of", "start_mode"]
