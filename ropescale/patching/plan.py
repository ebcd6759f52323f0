"""Planning a patch: what a scaling does to one model's config, decided and checked, nothing written.

:func:`plan_scaling` turns a :class:`~ropescale.scaling.Scaling` and a transformers config into a frozen
:class:`PatchPlan`: the method at the factor it resolves to, the original geometry, what became of a shipped
scaling, and the method's answers on that geometry (:class:`~ropescale.methods.base.Rotary`), asked once.
:mod:`ropescale.patching.model` writes a plan into a config (``rope_parameters``, ``max_position_embeddings``
and the provenance block ``config.ropescale``) and installs it into a model. Methods transformers cannot
express are written as ``rope_type: "ropescale_<method>"``; a checkpoint saved by
:func:`ropescale.save_pretrained` then declares ``model_type: "ropescale_<type>"`` with an ``auto_map``, so
plain transformers stops at the config and asks for remote code (which hands the load to ropescale) instead
of crashing inside the model.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from ..attention.modes import mode as attention_row
from ..errors import RopescaleError
from ..methods import RotarySpec, ScalingMethod, get_method, method_class
from ..methods.base import Rotary
from ..methods.factor import resolve_factor
from ..methods.types import MethodParams, MethodRef, RopeParameters
from ..scaling import (
    KEEP,
    REPLACE,
    Scaling,
    as_scaling,
    kv_consistent_for,
    kv_consistent_option,  # noqa: F401 - evals/ import it from here
)
from .geometry import CarriedScaling, is_scaled, original_geometry, provenance, scaling_label
from .shipped import COMPOSE, Shipped, shipped_of, start_mode
from .supported import (  # noqa: F401 - re-exported: callers import the supported models and geometry from here
    SUPPORTED_MODEL_TYPES,
    _head_dim,
    check_supported,
    original_spec,
    quiet_transformers,
    rotary_spec,
    trained_context,
)
from .window import sliding_window_setting  # noqa: F401 - re-exported

NON_NATIVE_PREFIX = "ropescale_"
INT64_MAX = 2**63 - 1  # the largest max_position_embeddings a loader can hold
#: Loader that plain transformers finds through ``auto_map`` for checkpoints it cannot build.
REMOTE_CODE_MODULE = "modeling_ropescale"


@dataclass(frozen=True)
class PatchPlan:
    """What patching does to one config: the method, the original geometry, and the result."""

    method: ScalingMethod
    spec: RotarySpec  # the ORIGINAL geometry (base and context before any scaling)
    original_rope_parameters: RopeParameters
    original_max_position_embeddings_field: int
    #: dynamic methods: rotate cached keys with the current frequencies (``ropescale.attention``)
    kv_consistent: bool = False
    #: one line: the context the scaling is measured from and what became of a shipped scaling (with sources)
    start: str = ""
    #: on a checkpoint that carried a scaling: ``compose`` (built on it) or ``replace``; None on plain RoPE
    mode: str | None = None
    #: rebuilt from a checkpoint whose weights were trained with this scaling (``ropescale export``)
    fine_tuned: bool = False
    #: Mistral-style sliding window, as the Scaling asked (``"keep"``, None or a width)
    sliding_window: Any = KEEP
    #: what the method makes of the geometry (:meth:`~ropescale.methods.base.ScalingMethod.on`), asked
    #: once: the planner passes the one it checked; otherwise it is computed here
    rotary: Rotary | None = field(default=None, repr=False)
    #: transformers builds the rotary module from the written ``rope_parameters`` alone
    native: bool = field(init=False)
    #: the attention-level mode patching installs (``ropescale.attention``), or None
    attention_mode: str | None = field(init=False)
    #: whether ropescale installs its own rotary module (otherwise transformers builds it)
    custom_rotary: bool = field(init=False)

    def __post_init__(self) -> None:
        # the facts every reader of a plan needs, settled with it: loading, writing and printing read them
        rotary = self.rotary if self.rotary is not None else self.method.on(self.spec, check=False)
        mode = attention_mode(self.method, self.kv_consistent)
        object.__setattr__(self, "rotary", rotary)
        object.__setattr__(self, "native", rotary.rope_parameters is not None)
        object.__setattr__(self, "attention_mode", mode)
        object.__setattr__(self, "custom_rotary", rotary.rope_parameters is None or mode is not None)


def attention_mode(method: ScalingMethod, kv_consistent: bool) -> str | None:
    """The attention-level mode a method installs: its own (Self-Extend), the KV-consistent one, or None.

    A method names its mode (the methods room sits below the attention room); the name is checked here
    against the modes' table, so a mode without its row (and kernel) is one line when the plan is made."""
    mode = method.attention or ("kv_consistent" if kv_consistent else None)
    return mode if mode is None else attention_row(mode).name


def plan_patch(
    config: Any,
    method: str | ScalingMethod | Scaling,
    factor: float | None = None,
    original_max_position_embeddings: int | None = None,
    replace: bool = False,
    *,
    target_length: int | None = None,
    compose: bool | None = None,
    shipped_context: int | None = None,
    **params: Any,
) -> PatchPlan:
    """Validate everything and decide what patching will do, without changing ``config``.

    ``method`` is a :class:`~ropescale.scaling.Scaling` (and nothing else is given), or the keyword form
    it is built from (:meth:`Scaling.of`): a method name or object, its factor (or ``target_length``), the
    pretraining context, ``replace``/``compose``, ``shipped_context`` and the method's parameters.
    """
    options = {"compose": True} if compose else {}
    options.update({"shipped_context": shipped_context} if shipped_context else {})
    scaling = as_scaling(
        method, factor, original_max_position_embeddings, replace, target_length=target_length, **params, **options
    )
    return plan_scaling(config, scaling)


def plan_scaling(config: Any, scaling: Scaling) -> PatchPlan:
    """The plan of ``scaling`` on ``config``'s model, which is not changed.

    ``target_length`` (instead of ``factor``) asks for the factor that reaches that context. On a
    checkpoint that already carries a scaling the new one is composed on top of it (``compose``, from the
    shipped context) or replaces it (``replace``, from the pretraining frequencies): the user's word
    (:attr:`Scaling.start`), else the rule of :mod:`ropescale.patching.shipped` (composed where the
    weights were trained with the shipped scaling); :attr:`PatchPlan.start` says which, and where each
    context came from.
    """
    s = scaling
    if s.method is None:
        raise ValueError("the checkpoint's own scaling has no plan to make: load it as saved (no method)")
    check_supported(config)
    shipped = shipped_of(config, s.shipped_context, s.original_context)
    mode, compose, replace = None, s.start == COMPOSE, s.start == REPLACE
    if is_scaled(config):
        mode = start_mode(shipped, compose or None, replace or None, _model_name(config))
        _check_target_within(shipped, s.target_length, replace, config)
    elif compose:
        raise RopescaleError("--compose builds on a shipped scaling, and this model carries none (plain RoPE)")
    if mode == COMPOSE:
        return _plan_composed(config, shipped, s)
    original = s.original_context
    if original is None and mode is None and shipped.family:
        original = shipped.pretraining  # the family table's, named in plan.start
    if isinstance(s.method, ScalingMethod):
        method = s.method
    else:
        saved = _as_saved(config, s.method, s.factor, s.target_length) if mode and not s.params else {}
        factor = s.factor
        if s.target_length is not None:
            factor = resolve_factor(s.method, factor, s.target_length, original_geometry(config, original)[2])
        if saved:  # a re-patch naming no parameter keeps the saved ones (a fine-tuned checkpoint's own)
            method = get_method(s.method, **saved, **({"factor": factor} if factor is not None else {}))
        else:  # the object the edge checked, unless a target length gave the factor only now
            method = s.resolved if s.target_length is None else s.build(factor)
    rope, field_, L = original_geometry(config, original)
    spec = rotary_spec(config, rope, L)
    rotary = method.on(spec)  # validated against the geometry; asked once, the plan carries the answer
    _check_int64(method, rotary, spec)
    kv = kv_consistent_for(method.name, rotary.varies_with_length, s.kv_consistent)
    start = _start_text(shipped, mode, L)
    return PatchPlan(method, spec, rope, field_, kv, start, mode, sliding_window=s.sliding_window, rotary=rotary)


def _model_name(config: Any) -> str:
    return f"'{config._name_or_path}'" if getattr(config, "_name_or_path", "") else "the model"


def _check_int64(scaling: ScalingMethod, rotary: Rotary, spec: RotarySpec) -> None:
    written = rotary.max_position_embeddings
    if written > INT64_MAX:  # transformers would write it; every loader would then overflow
        raise ValueError(
            f"factor {scaling.factor:g} x original context {spec.original_max_position_embeddings} gives "
            f"max_position_embeddings = {written}, beyond int64 ({INT64_MAX}); use a smaller --factor"
        )


def _check_target_within(shipped: Shipped, target_length: int | None, explicit_replace: bool, config: Any) -> None:
    """A target the checkpoint already serves as shipped needs no new scaling: say so, and how to check it."""
    if target_length is None or explicit_replace or target_length > shipped.context:
        return
    raise RopescaleError(
        f"target length {target_length} is within the shipped context {shipped.context} ({shipped.context_source}): "
        f"the model serves it as shipped ({scaling_label(shipped.scaling or {})}); check it with `ropescale eval passkey "
        f"--model {getattr(config, '_name_or_path', '') or 'M'} --lengths {target_length}` (its saved scaling), or pass --replace to rescale from the "
        "pretraining context"
    )


def _start_text(shipped: Shipped, mode: str | None, L: int) -> str:
    """One line: which context the new scaling is measured from, and what became of the shipped one."""
    if mode is None:
        return f"from the pretraining context {L} ({shipped.pretraining_source})"
    why = {True: "trained with it", False: "applied without training", None: "unknown"}[shipped.trained]
    why = f"{why}: {shipped.trained_source}" if shipped.trained is not None else why
    if (mode == COMPOSE) != bool(shipped.trained):  # the user's flag decided, not the rule
        why += f"; --{mode}"
    if mode == COMPOSE:
        return (
            f"composed on the shipped {scaling_label(shipped.scaling or {})} ({why}), from the shipped context {shipped.context} "
            f"({shipped.context_source})"
        )
    return (
        f"replaced the shipped {scaling_label(shipped.scaling or {})} ({why}), from the pretraining "
        f"frequencies and context {L} ({shipped.pretraining_source})"
    )


def _plan_composed(config: Any, shipped: Shipped, s: Scaling) -> PatchPlan:
    """The plan of a method composed on top of the shipped scaling (:mod:`ropescale.methods.composed`)."""
    from ..methods.composed import COMPOSABLE, Composed

    if isinstance(s.method, ScalingMethod):
        name, factor = s.method.name, s.method.factor
        params = {k: v for k, v in s.method.params().items() if k != "factor"}
    else:
        name, factor, params = method_class(s.method).name, s.factor, s.params
    if name == "default":
        raise RopescaleError(
            f"--method none on top of the shipped {scaling_label(shipped.scaling or {})} is the model as shipped: evaluate it "
            "with its saved scaling (no --method), or pass --replace to remove the scaling"
        )
    if name not in COMPOSABLE:
        raise RopescaleError(
            f"{name} cannot be composed on the shipped {scaling_label(shipped.scaling or {})} ({shipped.trained_source}): "
            f"ropescale composes {', '.join(COMPOSABLE)}; pass --replace to run {name} from the pretraining frequencies"
        )
    base = _shipped_method(config, shipped.scaling or {})
    factor = resolve_factor(name, factor, s.target_length, shipped.context)
    scaling = Composed(
        factor=1.0 if factor is None else factor,
        base=base,
        on_top={"method": name, "params": {k: v for k, v in params.items() if v is not None}},
        shipped_context=shipped.context,
    )
    scaling.outer  # noqa: B018 - the second method's parameters fail here, naming themselves
    rope, field_, L = original_geometry(config)
    spec = rotary_spec(config, rope, L)
    rotary = scaling.on(spec)
    _check_int64(scaling, rotary, spec)
    start = _start_text(shipped, COMPOSE, L)
    kv = kv_consistent_for(scaling.name, rotary.varies_with_length, s.kv_consistent)
    return PatchPlan(scaling, spec, rope, field_, kv, start, COMPOSE, sliding_window=s.sliding_window, rotary=rotary)


def _shipped_method(config: Any, carried: CarriedScaling) -> MethodRef:
    """The shipped scaling as ``{"method", "params"}`` a method can be built from (its own keys only)."""
    block = provenance(config)
    name = str(block["method"] if block else carried.get("method"))
    try:
        cls = method_class(name)
    except ValueError:
        raise RopescaleError(f"cannot compose on the shipped rope_type '{name}': unknown to ropescale") from None
    if cls.dynamic or cls.attention is not None:
        raise RopescaleError(
            f"cannot compose on the shipped {name}: its frequencies follow the length or live in the attention; "
            "pass --replace"
        )
    source = dict(block["params"]) if block else dict(carried.get("params") or {})
    known = cls.parameter_defaults()
    kept = {k: v for k, v in source.items() if k in known and v is not None}
    get_method(cls.name, **kept)  # the shipped parameters must build a method (else one line, here)
    return {"method": cls.name, "params": kept}


def _as_saved(config: Any, method: Any, factor: float | None, target_length: int | None) -> MethodParams:
    """The saved scaling's own parameters when a re-patch asks for the same method at the same factor and
    names no parameter: a fine-tuned checkpoint is measured with the scaling it was trained with (its
    attention factor, say), not the method's defaults. Anything else starts from the defaults."""
    block = provenance(config) if isinstance(method, str) and target_length is None else None
    if block is None or method_class(method).name != block["method"]:
        return {}
    saved = {k: v for k, v in block["params"].items() if v is not None}
    same = factor is None or float(factor) == float(saved.get("factor", -1))
    return {k: v for k, v in saved.items() if k != "factor" or factor is None} if same else {}


def check_method_args(method: str | ScalingMethod | Scaling, factor: Any = None, **params: Any) -> None:
    """Validate a method name and its parameters before any model is resolved, converted or loaded
    (:meth:`ropescale.scaling.Scaling.check`; the keyword form is :meth:`~ropescale.scaling.Scaling.of`'s).

    What needs the model (list lengths against its rotary dim, a target length against its
    context) is checked later by :func:`plan_patch`; a missing ``factor`` is checked with the
    method's default.

    Raises:
        ValueError: an unknown method or parameter, or a bad value, in one line naming it.
    """
    as_scaling(method, factor, **params).check()


def plan_from_provenance(config: Any) -> PatchPlan | None:
    """Rebuild the patch plan recorded in a saved config (used when reloading a checkpoint)."""
    block = provenance(config)
    if block is None:
        return None
    params = {k: v for k, v in block["params"].items() if v is not None}
    method = get_method(block["method"], **params)
    rope = copy.deepcopy(block["original_rope_parameters"])
    spec = rotary_spec(
        config, {**rope, "rope_theta": block["original_rope_theta"]}, block["original_max_position_embeddings"]
    )
    return PatchPlan(
        method,
        spec,
        rope,
        int(block["original_max_position_embeddings_field"]),
        bool(block.get("kv_consistent", False)),
        str(block.get("start") or ""),
        block.get("mode"),
        bool(block.get("fine_tuned", False)),
    )
