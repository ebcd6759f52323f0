"""What an engine serves from the checkpoint ``ropescale patch`` saves: ``ropescale recommend --serve-with``.

A recommendation is only useful where it can run. Attention-level methods (Self-Extend, DCA, STRING)
run only where ropescale patches the model; dynamic NTK saves with ropescale's KV-consistent mode,
which no engine reproduces; TGI never applies a ``linear`` factor. Rather than a second table of who
serves what, each candidate is judged the way ``ropescale doctor`` judges a saved checkpoint: the model's
config is patched as ``ropescale patch`` would write it (no weights), its config.json (with the legacy
keys ropescale writes beside ``rope_parameters``) is read by the engine rows of
:mod:`ropescale.interop.engines`, and a candidate is served when every row the engine name selects
``keeps`` the scaling (``vllm`` selects every vLLM row; ``vllm==0.33.0`` one).
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from typing import Any

from ropescale.errors import RopescaleError
from ropescale.evals.advice.evidence import Evidence, Measured
from ropescale.evals.advice.records import Params
from ropescale.interop.engines import ENGINES, KEEPS, Engine, select


def known_engines() -> list[str]:
    """The names ``--serve-with`` takes: each engine's name (all its rows) and each row's key."""
    names = [e.name.lower() for e in ENGINES] + [e.key for e in ENGINES]
    return list(dict.fromkeys(names))


def engines_for(value: str) -> tuple[Engine, ...]:
    """The :data:`~ropescale.interop.engines.ENGINES` rows ``value`` names (as ``doctor --engines`` reads
    one item: a row prefix or ``ENGINE==VERSION``).

    Raises:
        RopescaleError: one line naming the value and the known engines.
    """
    rows: tuple[Engine, ...] = ()
    if value.strip() and "," not in value:
        try:
            rows = select(value)
        except ValueError:
            rows = ()
    if not rows:
        raise RopescaleError(
            f"--serve-with {value!r}: unknown engine; known: {', '.join(known_engines())} "
            "(or ENGINE==VERSION, e.g. vllm==0.33.0, as `ropescale doctor --engines` takes)"
        )
    return rows


@dataclass
class Serving:
    """One engine (its rows) and the model whose saved checkpoint it would load."""

    value: str  #: as the user wrote it
    engines: tuple[Engine, ...]
    config: Any  #: the model's transformers config (no weights)
    original_context: int | None = None  #: --original-max-position-embeddings, where given
    replace: bool = False  #: the model is already scaled: patch re-scales from its original geometry

    @property
    def name(self) -> str:
        names = list(dict.fromkeys(f"{e.name} {e.versions}" for e in self.engines))
        return names[0] if len(names) == 1 else " / ".join(dict.fromkeys(e.name for e in self.engines))

    def refusals(self, method: str, target_length: int, params: Params | None = None) -> list[str]:
        """Why the engine does not serve ``method`` as ``ropescale patch`` saves it: ``"<engine rows>:
        <verdict> (<why>)"`` per row that does not keep it; empty where every row keeps it."""
        from ropescale.interop.legacy import with_legacy_keys
        from ropescale.interop.verdict import check
        from ropescale.patching.model import patch_config

        with warnings.catch_warnings():  # the save-time warnings name engines too; the verdicts say it here
            warnings.simplefilter("ignore")
            try:
                patched = patch_config(
                    self.config,
                    method,
                    original_max_position_embeddings=self.original_context,
                    replace=self.replace,
                    target_length=target_length,
                    **(params or {}),
                )
            except (ValueError, RopescaleError) as exc:  # a method this model cannot take is not served
                return [f"ropescale cannot save it for this model ({exc})"]
        data = with_legacy_keys(json.loads(patched.to_json_string(use_diff=False)))
        verdicts = [v for v in check(data, "config.json", self.engines).verdicts if v.engine != "ropescale"]
        return [f"{v.name} {v.versions}: {v.verdict} ({v.why})" for v in verdicts if v.verdict != KEEPS]

    def serves(self, method: str, target_length: int, params: Params | None = None) -> bool:
        return not self.refusals(method, target_length, params)

    def served_methods(self, target_length: int) -> list[str]:
        """The registered methods (default parameters) this engine keeps at ``target_length``."""
        from ropescale.methods import METHODS

        return [m for m in METHODS if m != "default" and self.serves(m, target_length)]


def served_rule_method(rec: Any, serving: Any, method: str) -> str | None:
    """The rule's method where the engine serves it, else YaRN where it serves that; None (and the one
    line saying what it does serve) where it serves neither."""
    candidates = list(dict.fromkeys([method, "yarn"]))
    for name in candidates:
        refused = serving.refusals(name, rec.target_length)
        if not refused:
            if name != method:
                rec.reasons.append(f"{method} is not served by {serving.name}: {refused_first(serving, method, rec)}")
                rec.serve = f"not {method}: {serving.value} {refused_first(serving, method, rec).split(': ', 1)[1]}"
            return name
    served = serving.served_methods(rec.target_length)
    rec.budget, rec.method, rec.factor = "none", None, None
    rec.why = (
        f"{serving.value} serves none of the candidates ({', '.join(candidates)}) from a saved checkpoint "
        f"({refused_first(serving, candidates[0], rec)}); it serves: {', '.join(served) or 'no scaling method'}"
    )
    rec.reasons.append(rec.why)
    return None


def refused_first(serving: Any, method: str, rec: Any) -> str:
    return (serving.refusals(method, rec.target_length) or ["keeps it"])[0]


def served_rows(rec: Any, evidence: list[Evidence], serving: Any) -> list[Evidence]:
    """The evidence with only the rows the engine serves (and the unscaled reference), so the frontier
    picks among what can run there; what the unrestricted frontier would pick is said when it goes."""
    from dataclasses import replace

    from ropescale.evals.advice.frontier import frontier_choice

    cache: dict[str, bool] = {}

    def served(row: Measured) -> bool:
        key = f"{row.method} {sorted(row.params.items())}"
        if key not in cache:
            cache[key] = row.method == "default" or serving.serves(row.method, rec.target_length, dict(row.params))
        return cache[key]

    best = frontier_choice(evidence, rec.original_context, rec.target_length)
    if best is not None and not served(best[0].row):
        row = best[0].row
        rec.reasons.append(
            f"the measured frontier's {row.title} ({best[1].source}) is not served by {serving.name}: "
            + refused_first(serving, row.method, rec)
        )
        why = refused_first(serving, row.method, rec).split(": ", 1)[-1]
        rec.serve = f"not {row.title}, the measured frontier's pick ({best[1].source}): {serving.value} {why}"
    return [replace(ev, rows=tuple(r for r in ev.rows if served(r))) for ev in evidence]
