"""What every scaling method shares: the model's rotary geometry and the method contract.

The contract follows transformers' ``modeling_rope_utils``: a method turns the rotary geometry
(and, for dynamic methods, the current sequence length) into ``(inv_freq, attention_factor)``.
``inv_freq`` is the fp32 vector of per-pair angular frequencies θ'_i; ``attention_factor`` is the
scalar that multiplies both cos and sin (so attention logits scale by its square).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import torch

from .types import MethodParams, RopeParameters

T = TypeVar("T")


@dataclass(frozen=True)
class RotarySpec:
    """The rotary geometry of a model, independent of any scaling.

    Args:
        head_dim: size of one attention head.
        base: RoPE base ``b`` (``rope_theta``).
        original_max_position_embeddings: the context ``L`` the model was trained at.
        partial_rotary_factor: fraction of ``head_dim`` that is rotated (1.0 for Llama/Mistral).
    """

    head_dim: int
    base: float
    original_max_position_embeddings: int
    partial_rotary_factor: float = 1.0

    def __post_init__(self) -> None:
        if isinstance(self.head_dim, bool) or not isinstance(self.head_dim, numbers.Integral) or self.head_dim <= 0:
            raise ValueError(f"head_dim must be a positive integer, got {self.head_dim!r}")
        _check_finite("base", self.base)
        if self.base <= 1:
            raise ValueError(f"base (rope_theta) must be > 1, got {self.base!r}")
        L = self.original_max_position_embeddings
        if isinstance(L, bool) or not isinstance(L, numbers.Integral) or L <= 0:
            raise ValueError(
                "original_max_position_embeddings must be a positive integer, "
                f"got {self.original_max_position_embeddings!r}"
            )
        if not 0 < self.partial_rotary_factor <= 1:
            raise ValueError(f"partial_rotary_factor must be in (0, 1], got {self.partial_rotary_factor!r}")
        if self.dim < 2 or self.dim % 2:
            raise ValueError(f"rotary dim must be even and >= 2, got {self.dim}")

    @property
    def dim(self) -> int:
        """Rotary dimension d = head_dim × partial_rotary_factor (as transformers computes it)."""
        return int(self.head_dim * self.partial_rotary_factor)

    def base_inv_freq(self, base: float | None = None, device: torch.device | None = None) -> torch.Tensor:
        """Unscaled θ_i = b^(−2i/d) for i = 0..d/2−1, in fp32. # [d/2]"""
        b = self.base if base is None else base
        exponents = torch.arange(0, self.dim, 2, dtype=torch.int64, device=device).float() / self.dim
        return 1.0 / (b**exponents)


def _check_finite(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):  # numpy scalars are Real too
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return float(value)


def check_number(name: str, value: Any, *, minimum: float | None = None, strict: bool = False) -> float:
    """Validate a finite number, optionally bounded below; raise ``ValueError`` naming ``name``."""
    value = _check_finite(name, value)
    if minimum is not None and (value <= minimum if strict else value < minimum):
        raise ValueError(f"{name} must be {'>' if strict else '>='} {minimum:g}, got {value:g}")
    return value


def coerce(name: str, value: Any, kind: type) -> Any:
    """Convert a user-given value (possibly a string from the CLI) to ``kind`` or raise ``ValueError``."""
    if value is None:
        return None
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in {"true", "1", "yes", "false", "0", "no"}:
            return value.lower() in {"true", "1", "yes"}
        raise ValueError(f"{name} must be true or false, got {value!r}")
    if kind is float:
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise ValueError(f"{name} must be a number, got {value!r}") from None
        return _check_finite(name, value)
    if kind is tuple:
        if isinstance(value, str):
            try:
                value = [float(v) for v in value.strip("[]() ").split(",") if v.strip()]
            except ValueError:
                raise ValueError(f"{name} must be a comma-separated list of numbers, got {value!r}") from None
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{name} must be a list of numbers, got {value!r}")
        return tuple(_check_finite(f"{name}[{i}]", v) for i, v in enumerate(value))
    raise TypeError(kind)


@dataclass(frozen=True)
class Rotary:
    """What one method makes of one model's geometry (:meth:`ScalingMethod.on`), computed once."""

    #: transformers' ``rope_parameters`` for the method, or None where transformers cannot express it
    rope_parameters: RopeParameters | None
    #: what patching writes to ``config.max_position_embeddings``
    max_position_embeddings: int
    #: the context the scaling targets (factor × L)
    extended_context: int
    #: the method's parameters as JSON values (the provenance block's ``params``)
    params: MethodParams
    #: whether the frequencies follow the current length (what KV consistency is about)
    varies_with_length: bool


@dataclass(frozen=True)
class ScalingMethod:
    """Base class of every scaling method: a frozen, validated set of parameters.

    Subclasses set ``name``, add their own fields, implement :meth:`compute` and, where
    transformers can build the method from ``config.rope_parameters``, :meth:`rope_parameters`.
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    #: the README's "training-free" and "runs in" columns (tests/test_docs.py keeps them equal):
    #: whether it works without fine-tuning, and which loaders apply it from the saved config
    training_free: ClassVar[str] = ""
    runs_in: ClassVar[str] = ""
    #: recomputed from the current sequence length (keeps ``max_position_embeddings`` at L)
    dynamic: ClassVar[bool] = False
    #: the attention-level mode patching installs instead of (or beside) new frequencies: a row of
    #: ``ropescale.attention.modes``; None for methods that only change frequencies
    attention: ClassVar[str | None] = None

    #: the keys of transformers' ``rope_parameters`` besides ``rope_type`` (the method's name) and
    #: ``rope_theta``, in the order written, for methods that transformers builds from their own fields;
    #: None: :meth:`rope_parameters` says (or transformers cannot express the method)
    rope_keys: ClassVar[tuple[str, ...] | None] = None

    factor: float = 1.0

    def __init__(self, *args: object, **values: object) -> None:
        """Every method's one constructor (subclasses are ``@dataclass(frozen=True, init=False)``), as the
        dataclass one took its arguments: the declared fields from ``args`` (in order) and ``values``, or their defaults, converted and checked (:meth:`__post_init__`).

        One constructor, here, because the one dataclass generates for each subclass ran in the subclass's
        module, which handed the new value to this module's checks and took it back, and the subclass's own
        ``validate`` and ``rope_parameters`` did the same again (issue 53's factor path). A method is now built
        and checked in one place from what its class declares: its fields, their :func:`bounded` checks,
        :attr:`rope_keys`, and :meth:`validate` only for a rule that is more than a bound."""
        fields = [f for f in dataclasses.fields(self) if f.init]
        if len(args) > len(fields):
            raise TypeError(f"{type(self).__name__}() takes {len(fields)} arguments but {len(args)} were given")
        for f, value in zip(fields, args):
            if f.name in values:
                raise TypeError(f"{type(self).__name__}() got multiple values for argument {f.name!r}")
            values[f.name] = value
        unknown = sorted(set(values) - {f.name for f in fields})
        if unknown:
            raise TypeError(f"{type(self).__name__}() got an unexpected keyword argument {unknown[0]!r}")
        for f in fields:
            if f.name in values:
                value = values[f.name]
            elif f.default is not dataclasses.MISSING:
                value = f.default
            elif f.default_factory is not dataclasses.MISSING:
                value = f.default_factory()
            else:
                raise TypeError(f"{type(self).__name__}() missing required argument {f.name!r}")
            object.__setattr__(self, f.name, value)
        self.__post_init__()

    def __post_init__(self) -> None:
        # CLI values arrive as text: each field converted to its annotated type before it is checked
        fields = dataclasses.fields(self)
        for f in fields:
            kind = {"float": float, "bool": bool, "tuple": tuple}.get(_base_type(f.type))
            if kind is not None:
                object.__setattr__(self, f.name, coerce(f.name, getattr(self, f.name), kind))
        check_number("factor", self.factor, minimum=1.0)
        for f in fields:  # the declared bounds (:func:`bounded`), each value first, then how values relate
            value, minimum = getattr(self, f.name), f.metadata.get("above")
            if value is not None and minimum is not None:
                check_number(f.name, value, minimum=minimum, strict=True)
        for f in fields:
            value, other = getattr(self, f.name), f.metadata.get("above_field")
            if other is not None and value is not None and value <= getattr(self, other):
                raise ValueError(
                    f"{f.name} must be > {other}, got {f.name}={value:g} <= {other}={getattr(self, other):g}"
                )
            together = f.metadata.get("together")
            if together is not None and (value is None) != (getattr(self, together[0]) is None):
                raise ValueError(f"{f.name} and {together[0]} must be given together ({together[1]})")
        self.validate()

    def validate(self) -> None:
        """Check what the fields' declared bounds (:func:`bounded`) cannot say; raise ``ValueError`` naming the
        bad parameter."""

    def validate_for(self, spec: RotarySpec) -> None:
        """Check parameters that depend on the model's geometry (e.g. list lengths)."""

    def compute(
        self, spec: RotarySpec, seq_len: int | None = None, device: torch.device | None = None
    ) -> tuple[torch.Tensor, float]:
        """Return ``(inv_freq [d/2] fp32, attention_factor)`` for ``spec`` at ``seq_len``."""
        raise NotImplementedError

    def rope_parameters(self, spec: RotarySpec) -> RopeParameters | None:
        """A complete transformers ``rope_parameters`` dict, or None if transformers cannot express it: by
        default :attr:`rope_keys` of the method's parameters (those that are None left out)."""
        if self.rope_keys is None:
            return None
        values = {**self.params(), "original_max_position_embeddings": spec.original_max_position_embeddings}
        kept = {k: values[k] for k in self.rope_keys if values[k] is not None}
        return {"rope_type": self.name, "rope_theta": spec.base, **kept}  # type: ignore[typeddict-item]

    def extended_context(self, spec: RotarySpec) -> int:
        """The context this scaling targets: factor × L."""
        return int(round(self.factor * spec.original_max_position_embeddings))

    def varies_with_length(self) -> bool:
        """Whether the frequencies depend on the current length ℓ, so that keys cached (rotated) at one
        length are stale at another: dynamic methods, and LongRoPE's switch at L."""
        return self.dynamic

    def max_position_embeddings(self, spec: RotarySpec) -> int:
        """What patching writes to ``config.max_position_embeddings``.

        Static methods raise it to factor × L. Dynamic ones keep L, because transformers reads
        that field as the original context when it recomputes the frequencies.
        """
        return spec.original_max_position_embeddings if self.dynamic else self.extended_context(spec)

    def params(self) -> MethodParams:
        """The method's parameters as plain JSON values (provenance, CLI listing)."""
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            out[f.name] = list(v) if isinstance(v, tuple) else v
        return out

    def resolved_params(self, spec: RotarySpec) -> MethodParams:
        """:meth:`params` with defaults that depend on the model filled in (for summaries)."""
        return self.params()

    def on(self, spec: RotarySpec, check: bool = True) -> Rotary:
        """Everything patching and loading need from this method on one model, asked once: the plan
        holds the answer, so what writes the config, loads the model or prints a summary reads facts
        instead of asking the method again from each module (issue 53).

        ``check``: validate against the geometry first (:meth:`validate_for`); a plan rebuilt from a
        saved provenance block skips it (it was checked when it was made)."""
        if check:
            self.validate_for(spec)
        return Rotary(
            rope_parameters=self.rope_parameters(spec),
            max_position_embeddings=self.max_position_embeddings(spec),
            extended_context=self.extended_context(spec),
            params=self.params(),
            varies_with_length=self.varies_with_length(),
        )

    @classmethod
    def parameter_defaults(cls) -> dict[str, Any]:
        """Parameter names and defaults (``dataclasses.MISSING`` for required ones)."""
        return {f.name: f.default for f in dataclasses.fields(cls)}


def bounded(
    default: T, *, above: float = 0.0, above_field: str | None = None, together: tuple[str, str] | None = None
) -> T:
    """A method parameter with its checks declared (run by :meth:`ScalingMethod.__post_init__`): the value,
    unless None, must be > ``above``; > the field ``above_field`` too; and ``together[0]`` must be given
    exactly when this one is (``together[1]`` says why)."""
    checks = {"above": above, "above_field": above_field, "together": together}
    return field(default=default, metadata=checks)  # type: ignore[return-value] - a Field stands for its default


def _base_type(annotation: Any) -> str:
    """'float' for 'float', 'float | None', ...; annotations are strings under postponed evaluation."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    return text.split("|")[0].strip().split("[")[0]
