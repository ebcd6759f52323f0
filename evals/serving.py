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

    def refusals(self, method: str, target_length: int, params: dict[str, Any] | None = None) -> list[str]:
        """Why the engine does not serve ``method`` as ``ropescale patch`` saves it: ``"<engine rows>:
        <verdict> (<why>)"`` per row that does not keep it; empty where every row keeps it."""
        from ropescale.interop.legacy import with_legacy_keys
        from ropescale.interop.verdict import check
        from ropescale.patching.plan import patch_config

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

    def serves(self, method: str, target_length: int, params: dict[str, Any] | None = None) -> bool:
        return not self.refusals(method, target_length, params)

    def served_methods(self, target_length: int) -> list[str]:
        """The registered methods (default parameters) this engine keeps at ``target_length``."""
        from ropescale.methods import METHODS

        return [m for m in METHODS if m != "default" and self.serves(m, target_length)]
