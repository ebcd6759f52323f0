"""The search space of the attention-level methods: small discrete grids of their parameters.

Self-Extend (arXiv 2401.01325), Dual Chunk Attention (arXiv 2402.17463) and STRING
(arXiv 2410.18745) keep plain (or a closed-form method's) frequencies and change which positions
attention sees, through a few integer parameters. Their space is a grid, with the same protocol as
:class:`ropescale.search.space.YarnSpace` (seeds, project, violations, key, mutate, crossover,
method_params, factors) plus :meth:`AttentionSpace.candidates`, every valid point, which lets the
engine stop when the grid is used up. With L the trained context and T = s·L the target:

* ``self_extend``: ``window`` W in powers of two from L/64 (at least 2) to L/2; ``group_size`` G from the smallest
  whose reach G·(L − W + W // G) ≈ (L − W)·G + W is at least T, up to ``group_extra`` more (coarser
  groups: more reach, blurrier far positions).
* ``dca``: ``chunk_size`` in eighths of L, 2L/8 … 7L/8; ``local_window`` L/128 … L/8 in powers of
  two; 2·local_window < chunk_size. DCA has no reach limit (its positions stay below chunk_size).
* ``string``: ``shift`` S in fractions of L (1/8 … 3/4, the paper's L/3 included); ``local_window``
  W in powers of two from L/256 to L/16, W < S; ``frequencies`` the frequency method STRING rotates
  with at the same factor (``yarn``, ``ntk``, ``linear``; plain RoPE only where L + S − W reaches T).
* all three: ``logn`` off or on (queries past L scaled by ln(p + 1) / ln(L)).

Every grid also holds the method's own default (the seed), so the search starts from it. Validity is
the method's own ``validate_for`` (Self-Extend's reach, DCA's and STRING's orderings) plus membership
of the grid.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..attention.modes import SEARCHED_MODES
from ..methods import RotarySpec, get_method
from .records import GridCandidate, MethodParams

#: the attention-level methods searched on a grid: their rows in ``ropescale.attention.modes``
ATTENTION_METHODS = SEARCHED_MODES
#: STRING's frequency choices, in the order mutations walk them
STRING_FREQUENCIES = ("yarn", "ntk", "linear", "default")
#: the log-length query scale off and on (:func:`ropescale.attention.function.logn_scale`)
LOGN = (False, True)
JUMP = 0.2  # probability that a mutation redraws one parameter anywhere on its grid


def _powers_of_two(low: float, high: float) -> list[int]:
    """Powers of two in [max(1, low), high]."""
    out, p = [], 1
    while p <= high:
        if p >= max(1.0, low):
            out.append(p)
        p *= 2
    return out


def _sorted_unique(values: list[int]) -> tuple[int, ...]:
    return tuple(sorted({int(v) for v in values if v >= 1}))


@dataclass(frozen=True)
class AttentionSpace:
    """A grid of one attention-level method's parameters (see the module docstring).

    Args:
        method: ``self_extend``, ``dca`` or ``string``.
        spec: the model's original rotary geometry.
        factor: s = target length / L.
        group_extra: Self-Extend group sizes above the smallest that reaches the target.
    """

    method: str
    spec: RotarySpec
    factor: float
    group_extra: int = 4

    def __post_init__(self) -> None:
        if self.method not in ATTENTION_METHODS:
            raise ValueError(
                f"attention space method must be one of {', '.join(ATTENTION_METHODS)}, got {self.method!r}"
            )
        if not self.factor > 1:
            raise ValueError(f"target length must exceed the original context (factor > 1), got factor {self.factor:g}")
        if isinstance(self.group_extra, bool) or not isinstance(self.group_extra, int) or self.group_extra < 0:
            raise ValueError(f"group_extra must be an integer >= 0, got {self.group_extra!r}")

    @property
    def L(self) -> int:
        return self.spec.original_max_position_embeddings

    @property
    def target(self) -> int:
        return int(round(self.factor * self.L))

    # -- the grid ------------------------------------------------------------------------------------
    def _default(self) -> GridCandidate:
        """The method's own defaults at this factor (STRING: with YaRN frequencies when plain RoPE falls short)."""
        resolved = get_method(self.method, factor=self.factor).resolved_params(self.spec)
        params = {k: v for k, v in resolved.items() if k != "factor"}
        if self.method == "string" and not self._string_reaches(params["shift"], params["local_window"], "default"):
            params["frequencies"] = "yarn"
        return params

    def grids(self) -> dict[str, tuple]:
        """Each parameter's grid (Self-Extend's group sizes: all those any window allows)."""
        return self._grids

    @cached_property
    def _grids(self) -> dict[str, tuple]:
        L, default = self.L, self._default()
        if self.method == "self_extend":
            windows = _sorted_unique([*_powers_of_two(max(2, L / 64), L / 2), default["window"]])
            low = min(self._group_range(w)[0] for w in windows)
            high = max(self._group_range(w)[1] for w in windows)
            return {"group_size": tuple(range(low, high + 1)), "window": windows, "logn": LOGN}
        if self.method == "dca":
            chunks = _sorted_unique([*(L * k // 8 for k in range(2, 8)), default["chunk_size"]])
            locals_ = _sorted_unique([*_powers_of_two(L / 128, L / 8), default["local_window"]])
            return {"chunk_size": chunks, "local_window": locals_, "logn": LOGN}
        fractions = ((1, 8), (1, 4), (1, 3), (1, 2), (2, 3), (3, 4))
        shifts = _sorted_unique([*(L * a // b for a, b in fractions), default["shift"]])
        locals_ = _sorted_unique([*_powers_of_two(L / 256, L / 16), default["local_window"]])
        return {"shift": shifts, "local_window": locals_, "frequencies": STRING_FREQUENCIES, "logn": LOGN}

    def _group_range(self, window: int) -> tuple[int, int]:
        """Self-Extend group sizes allowed with ``window``: the smallest that reaches the target, and a few more."""
        smallest = get_method("self_extend", factor=self.factor, window=window).resolved_group_size(self.spec)
        return smallest, smallest + self.group_extra

    def _string_reaches(self, shift: int, local_window: int, frequencies: str) -> bool:
        return frequencies != "default" or self.L + shift - local_window >= self.target

    def candidates(self) -> list[GridCandidate]:
        """Every valid point of the grid, in grid order."""
        grids = self.grids()
        names = list(grids)
        points = ({n: v for n, v in zip(names, values)} for values in itertools.product(*grids.values()))
        return [p for p in points if not self.violations(p)]

    @cached_property
    def size(self) -> int:
        """How many valid points the grid has (the engine stops there)."""
        return len(self.candidates())

    # -- the space protocol ----------------------------------------------------------------------------
    def seeds(self) -> list[tuple[str, GridCandidate]]:
        params = self._default()
        label = "string+yarn" if params.get("frequencies") == "yarn" else self.method
        return [(label, params)]

    def project(self, params: GridCandidate, round_values: bool = True) -> GridCandidate:
        """The nearest grid point (log scale for the integers), then the constraints restored by moving
        the parameter that breaks them (Self-Extend: the group size; DCA, STRING: the local window)."""
        del round_values  # a grid is always rounded
        params = {"logn": False, **params}  # absent: the methods' default
        grids = self.grids()
        out: GridCandidate = {}
        for name, grid in grids.items():
            value = params[name]
            if name == "frequencies":
                out[name] = value if value in grid else "yarn"
            elif name == "logn":
                out[name] = bool(value) if value in grid else False
            else:
                out[name] = min(grid, key=lambda g: (abs(math.log(g) - math.log(max(float(value), 1e-9))), g))
        if self.method == "self_extend":
            low, high = self._group_range(out["window"])
            out["group_size"] = int(min(max(out["group_size"], low), high))
        elif self.method == "dca":
            below = [w for w in grids["local_window"] if 2 * w < out["chunk_size"]]
            out["local_window"] = min(out["local_window"], max(below)) if below else grids["local_window"][0]
        else:
            below = [w for w in grids["local_window"] if w < out["shift"]]
            out["local_window"] = min(out["local_window"], max(below)) if below else grids["local_window"][0]
            if not self._string_reaches(out["shift"], out["local_window"], out["frequencies"]):
                out["frequencies"] = "yarn"
        return out

    def violations(self, params: GridCandidate, tol: float = 0.0) -> list[str]:
        """Which constraints ``params`` breaks (empty when valid): off the grid, or the method refuses it."""
        del tol
        params = {"logn": False, **params}  # absent: the methods' default
        problems = []
        grids = self.grids()
        for name, grid in grids.items():
            if params.get(name) not in grid:
                problems.append(f"{name} {params.get(name)!r} is not on the grid {list(grid)}")
        if any(name not in params for name in grids):
            return problems
        if self.method == "self_extend" and params["window"] in grids["window"]:
            low, high = self._group_range(params["window"])
            if params["group_size"] > high:
                problems.append(
                    f"group_size {params['group_size']} above {high} (the grid for window {params['window']})"
                )
        try:
            get_method(self.method, factor=self.factor, **params).validate_for(self.spec)
        except (TypeError, ValueError) as exc:
            problems.append(str(exc))
        return problems

    def key(self, params: GridCandidate) -> tuple:
        return tuple(params[name] for name in self.grids())

    def mutate(self, params: GridCandidate, rng: np.random.Generator, scale: float) -> tuple[GridCandidate, str]:
        """One parameter moved one grid step (two with probability ``scale``), or redrawn anywhere on its grid."""
        grids = self.grids()
        name = str(rng.choice(list(grids)))
        grid = list(grids[name])
        new = dict(params)
        if rng.random() < JUMP:
            new[name] = grid[int(rng.integers(len(grid)))]
            what = f"{name}=jump"
        else:
            steps = (2 if rng.random() < scale else 1) * (1 if rng.random() < 0.5 else -1)
            index = grid.index(params[name]) if params[name] in grid else 0
            new[name] = grid[min(max(index + steps, 0), len(grid) - 1)]
            what = f"{name}{steps:+d}"
        new[name] = new[name] if name in ("frequencies", "logn") else int(new[name])
        return self.project(new), what

    def crossover(self, a: GridCandidate, b: GridCandidate, rng: np.random.Generator) -> GridCandidate:
        """Each parameter from one parent or the other."""
        return self.project({name: (a if rng.random() < 0.5 else b)[name] for name in self.grids()})

    def method_params(self, params: GridCandidate) -> MethodParams:
        return {"factor": self.factor, **params}

    def factors(self, params: GridCandidate) -> list[float] | None:
        """None: the frequencies are not what is searched (no factor plot)."""
        return None


__all__ = ["ATTENTION_METHODS", "AttentionSpace"]
