"""The one scaling value: what is asked of a model's rotary embedding, built once where it is asked.

A scaling is asked for at several edges: the CLI's flags (``--method --factor --param --compose ...``), a
suite's ``methods:`` entry, a training recipe's ``scaling:`` section, a search's best result, a saved
checkpoint's provenance block, and the Python API's keywords. Each edge builds one :class:`Scaling`;
planning (:func:`ropescale.patching.plan.plan_patch`), patching, loading (:func:`ropescale.from_pretrained`),
training and evaluation take that value, and cells record its :meth:`Scaling.to_json`. Before it the
same facts travelled as keyword arguments, dicts and three look-alike records, and the patch options
(``compose``, ``shipped_context``, ``kv_consistent``) rode inside the method's ``**params`` (issue 53).

A Scaling is what was *asked*: the method by name (or a ready method object), its factor or the
target length to reach, its parameters, the contexts where config.json is wrong, what to do with a
scaling the checkpoint ships with, the sliding window and KV consistency. What it resolves to on one
model (the factor a target length gives, the shipped scaling it composes on, the rotary geometry) is
the :class:`~ropescale.patching.plan.PatchPlan` that planning returns, because that needs the model's
config.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, TypedDict

from .methods import ScalingMethod, method_class
from .methods.base import coerce
from .methods.registry import check_parameter_names
from .methods.types import MethodParams

KEEP = "keep"  # sentinel: leave Mistral's sliding_window as it is
COMPOSE, REPLACE = "compose", "replace"
#: what the method's parameters may not carry: each has its own field
RESERVED = ("factor", "method", "target_length")
#: patch options that used to ride in ``**params``; :meth:`Scaling.of` moves them to their fields
OPTIONS = ("compose", "shipped_context", "kv_consistent")


class ScalingRequest(TypedDict):
    """:meth:`Scaling.request`: what RULER's cells record of the scaling they ran."""

    method: str | None
    factor: float | None
    params: MethodParams


class ScalingJSON(TypedDict):
    """:meth:`Scaling.to_json`: every field, JSON-safe."""

    method: str | None
    factor: float | None
    target_length: int | None
    params: MethodParams
    original_context: int | None
    shipped_context: int | None
    start: str | None
    sliding_window: str | int | None
    kv_consistent: bool | None


@dataclass(frozen=True)
class Scaling:
    """A RoPE scaling as asked for (frozen; built once at each edge, see the module docstring).

    Attributes:
        method: a registered method name (``ropescale methods``; ``"none"`` is unscaled), a ready
            :class:`~ropescale.methods.ScalingMethod`, or None: the checkpoint's own scaling, as saved.
        factor: the scaling factor s (extended context = s × the context it starts from).
        params: the method's own parameters (``beta_fast``, ``long_factor`` ...), never the fields below.
        target_length: instead of ``factor``, the context to reach in tokens (resolved by the plan).
        original_context: the pretraining context L where config.json does not say it right.
        shipped_context: the context the checkpoint serves as shipped, where config.json and the family
            table are wrong (:mod:`ropescale.patching.shipped`).
        start: on a checkpoint that ships a scaling, ``"compose"`` (built on it) or ``"replace"`` (from the
            pretraining frequencies); None: the rule of :func:`ropescale.patching.shipped.start_mode`.
        sliding_window: ``"keep"``, None (full attention) or a width, for Mistral-style models.
        kv_consistent: rotate cached keys with the current frequencies (dynamic methods); None: the default.
    """

    method: str | ScalingMethod | None = "yarn"
    factor: float | None = None
    params: MethodParams = field(default_factory=dict)
    target_length: int | None = None
    original_context: int | None = None
    shipped_context: int | None = None
    start: str | None = None
    sliding_window: Any = KEEP
    kv_consistent: bool | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", dict(self.params or {}))  # a copy: the caller's dict stays theirs
        if self.start not in (None, COMPOSE, REPLACE):
            raise ValueError(f"start must be 'compose', 'replace' or None, got {self.start!r}")
        for key in (*RESERVED, *OPTIONS):
            if key in self.params:
                raise ValueError(f"'{key}' is a field of the scaling, not a method parameter")
        if isinstance(self.method, ScalingMethod) and (
            self.factor is not None or self.params or self.target_length is not None
        ):
            raise ValueError("give either a ScalingMethod instance or a method name with parameters, not both")

    @classmethod
    def of(
        cls,
        method: str | ScalingMethod | None = "yarn",
        factor: float | None = None,
        original_max_position_embeddings: int | None = None,
        replace: bool = False,
        sliding_window: Any = KEEP,
        *,
        target_length: int | None = None,
        **params: Any,
    ) -> Scaling:
        """The Scaling of the keyword form that :func:`ropescale.patch`, :func:`ropescale.patch_config` and
        :func:`~ropescale.patching.plan.plan_patch` have always taken (``compose=True``,
        ``shipped_context=N`` and ``kv_consistent=...`` among the parameters go to their fields)."""
        params = dict(params)
        compose = params.pop("compose", None)
        shipped_context = params.pop("shipped_context", None)
        kv_consistent = params.pop("kv_consistent", None)
        if replace and compose:
            raise ValueError("give --compose or --replace, not both")
        if isinstance(method, str) and method.strip().lower() == "saved":
            method = None  # the scaling the checkpoint carries, as the evaluation commands spell it
        return cls(
            method=method,
            factor=factor,
            target_length=target_length,
            params=params,
            original_context=original_max_position_embeddings,
            shipped_context=int(shipped_context) if shipped_context else None,
            start=REPLACE if replace else COMPOSE if compose else None,
            sliding_window=sliding_window,
            kv_consistent=kv_consistent,
        )

    @classmethod
    def evaluated(cls, method: str | None, factor: float | None = None, params: MethodParams | None = None) -> Scaling:
        """An evaluation's scaling (a suite's ``methods:`` entry, a RULER run): it replaces a scaling the
        checkpoint ships with, unless its parameters say ``compose: true``; ``"saved"`` is the checkpoint's own."""
        params = dict(params or {})
        compose = bool(params.pop("compose", False))
        return cls.of(method, factor, replace=not compose, **params, **({"compose": True} if compose else {}))

    @classmethod
    def from_request(
        cls, method: str | None, factor: float | None = None, params: MethodParams | None = None
    ) -> Scaling:
        """The inverse of :meth:`request`: ``compose: true`` among the parameters is the start, every other key
        a method parameter; without it the start is left to the caller (a RULER or LongPPL run replaces)."""
        params = dict(params or {})
        compose = params.pop("compose", False) is True
        return cls(method, factor, params, start=COMPOSE if compose else None)

    # what was asked, read back
    @property
    def as_saved(self) -> bool:
        """The checkpoint's own scaling: nothing to plan."""
        return self.method is None

    @property
    def unscaled(self) -> bool:
        return isinstance(self.method, str) and self.method.lower() in ("none", "default")

    @property
    def name(self) -> str:
        """The method's name as asked (``"saved"`` for the checkpoint's own)."""
        if self.method is None:
            return "saved"
        return self.method.name if isinstance(self.method, ScalingMethod) else self.method

    @property
    def compose(self) -> bool:
        return self.start == COMPOSE

    @property
    def replace(self) -> bool:
        return self.start == REPLACE

    @property
    def label(self) -> str:
        """A file-name-safe name of what was asked (RULER's cell names): ``yarn-x4``, ``yarn-x4-<hash>``."""
        name = self.name if self.method is not None else "as-saved"
        if self.factor is not None and name.lower() not in ("none", "default"):
            name += f"-x{self.factor:g}"
        asked = self.request()["params"]  # composed: a cell of its own, never mixed with the replaced one
        if asked:
            name += "-" + hashlib.sha256(json.dumps(asked, sort_keys=True).encode()).hexdigest()[:8]
        return name

    def method_params(self) -> MethodParams:
        """The method's parameters with the patch options among them: the keyword form (``**params``)."""
        return {
            **self.params,
            **({"compose": True} if self.compose else {}),
            **({"shipped_context": self.shipped_context} if self.shipped_context else {}),
            **({"kv_consistent": self.kv_consistent} if self.kv_consistent is not None else {}),
        }

    def with_(self, **changes: Any) -> Scaling:
        """A copy with ``changes`` (the value itself is frozen)."""
        return dataclasses.replace(self, **changes)

    # checks and building
    @cached_property
    def resolved(self) -> ScalingMethod:
        """The method object of what was asked, built and validated once (the value is frozen, so the
        object that passed :meth:`check` is the one the plan uses); with a target length instead of a
        factor, the method at its default factor (the plan builds it again at the factor the target gives)."""
        return self.build(None if self.target_length is not None else self.factor)

    def build(self, factor: float | None = None) -> ScalingMethod:
        """The method object at ``factor`` (default: the one asked), validated on its own (what needs the
        model is the plan's to check). :attr:`resolved` is the one built from what was asked."""
        if isinstance(self.method, ScalingMethod):
            return self.method
        if self.method is None:
            raise ValueError("the checkpoint's own scaling is read from its config, not built from a name")
        factor = self.factor if factor is None else factor
        cls = method_class(self.method)
        check_parameter_names(cls, self.params)
        return cls(**self.params, **({"factor": factor} if factor is not None else {}))

    def check(self) -> None:
        """Validate the method name, its parameters and the options that need no model, in one line each,
        before any model is resolved, converted or loaded (a missing factor is checked at the method's
        default; a target length is resolved against the model later)."""
        if self.method is None or isinstance(self.method, ScalingMethod):
            return
        method = self.resolved
        if self.kv_consistent is not None:  # the default needs no check: the plan decides it from the method
            kv_consistent_option(method, self.kv_consistent)

    def checked(self) -> Scaling:
        """This value after :meth:`check` (an edge builds and checks it in one expression)."""
        self.check()
        return self

    # JSON, at the file boundary
    def request(self) -> ScalingRequest:
        """``{"method", "factor", "params"}``: the three keys RULER's cells have recorded since their first
        schema (:mod:`ropescale.evals.tasks.ruler.record`), kept so that every shipped cell still matches. An
        evaluation replaces a shipped scaling unless asked to compose, so ``compose: true`` among the
        parameters is what tells a composed cell from a replaced one (RULER's cell reader reads it back)."""
        return {
            "method": None if self.method is None else self.name,
            "factor": self.factor,
            "params": {**self.params, **({"compose": True} if self.compose else {})},
        }

    def to_json(self) -> ScalingJSON:
        """Every field, JSON-safe; :meth:`from_json` reads it back (a ready method object is written by name
        and parameters)."""
        method, factor, params = self.method, self.factor, dict(self.params)
        if isinstance(method, ScalingMethod):
            method, factor, params = (
                method.name,
                method.factor,
                {k: v for k, v in method.params().items() if k != "factor"},
            )
        return {
            "method": method,
            "factor": factor,
            "target_length": self.target_length,
            "params": params,
            "original_context": self.original_context,
            "shipped_context": self.shipped_context,
            "start": self.start,
            "sliding_window": self.sliding_window,
            "kv_consistent": self.kv_consistent,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Scaling:
        known = {f.name for f in dataclasses.fields(cls) if f.init}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"a scaling has no field {', '.join(map(repr, unknown))}")
        return cls(**data)


def kv_consistent_option(method: ScalingMethod, value: Any) -> bool:
    """``kv_consistent``: default on for methods whose frequencies follow the current length (dynamic
    methods, LongRoPE with short ≠ long factors); only they have anything to make consistent."""
    return kv_consistent_for(method.name, method.varies_with_length(), value)


def kv_consistent_for(name: str, varies_with_length: bool, value: Any) -> bool:
    """:func:`kv_consistent_option` from what a plan already knows of the method (its name and
    :attr:`~ropescale.methods.base.Rotary.varies_with_length`), without asking the method again."""
    if value is None:
        return varies_with_length
    value = coerce("kv_consistent", value, bool)
    if value and not varies_with_length:
        raise ValueError(
            "kv_consistent applies to methods whose frequencies change with the length (dynamic_ntk, "
            f"dynamic_yarn, longrope with short_factor != long_factor); '{name}' has fixed frequencies "
            "here, so its cached keys are already consistent"
        )
    return value


def as_scaling(method: str | ScalingMethod | Scaling | None, *args: Any, **kwargs: Any) -> Scaling:
    """``method`` when it is a Scaling already (and nothing else is given), else :meth:`Scaling.of` of the
    keyword form: the one door of the functions that take either."""
    if isinstance(method, Scaling):
        if any(v is not None and v is not False and v != KEEP for v in (*args, *kwargs.values())):
            raise ValueError("give a Scaling or the method with its arguments, not both")
        return method
    return Scaling.of(method, *args, **kwargs)


__all__ = ["COMPOSE", "KEEP", "REPLACE", "Scaling", "as_scaling", "kv_consistent_for", "kv_consistent_option"]
