"""The search loop: seeds first, then evolutionary moves around the best candidates, within a budget
of evaluations, recorded atomically after each one and resumable.

Candidate k is a pure function of the first k recorded candidates and ``(seed, k)``, so a search
interrupted after any evaluation and resumed writes the same history as one that ran through
(on the same machine and data). A recorded candidate is never evaluated again; a proposal equal to
an earlier one is redrawn. The best candidate is the lowest calibration perplexity among all
recorded, seeds included, so the search can only improve on its seeds.

Moves (LongRoPE §3.2 uses mutation and crossover over a population seeded with PI/NTK/YaRN; with a
budget of tens of evaluations we keep the population to the best few and make smooth moves):

* mutate: a parent from the best four within 10% of the best perplexity (the best with
  probability 1/2) changed by the space's
  ``mutate`` with a step that shrinks as evaluations accumulate, σ_k = σ0 / sqrt(1 + k/8);
* crossover (probability 1/4 once two candidates exist): a blend of two of the best four.

A finite space (the attention-level methods' grids, :mod:`.grid`) falls back to a random point not
yet evaluated when 64 moves in a row give known ones, and ends the search once every point is in.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .._io import atomic_write_json
from ..errors import RopescaleError
from .objective import Score
from .records import Candidate, HistoryFile, MethodParams, SearchSettings, Trial

HISTORY_FORMAT = 1
POOL_RATIO = 1.1  # parents are within 10% of the best perplexity
STEP0 = 0.25  # σ0, in log λ (LongRoPE space) or log β (YaRN space)


class SearchSettingsMismatch(RopescaleError):
    """A history file exists for a different search (other model, target, data or space)."""


def load_history(path: Path, settings: SearchSettings) -> list[Trial]:
    """The candidates recorded in ``path`` (empty if none); refuse a history of other settings."""
    if not path.is_file():
        return []
    data = read_history(path)
    if data.get("settings") != settings:
        old = data.get("settings") or {}
        diff = sorted(k for k in set(old) | set(settings) if old.get(k) != settings.get(k))
        raise SearchSettingsMismatch(
            f"'{path.parent}' holds a search with other settings ({', '.join(diff)}); "
            "use another --output, or --overwrite to start again"
        )
    return list(data.get("candidates") or [])


def read_history(path: Path) -> HistoryFile:
    """The JSON object of a history file, refused when it is damaged or written by a newer ropescale
    (its ``format`` above :data:`HISTORY_FORMAT`: this version would rewrite it in its own format).

    Raises:
        RopescaleError: naming the file.
    """
    try:
        data = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise RopescaleError(f"search history '{path}' is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise RopescaleError(f"search history '{path}' holds a JSON {type(data).__name__}, not an object")
    version = data.get("format", 1)
    if not isinstance(version, int) or version > HISTORY_FORMAT:
        raise RopescaleError(
            f"search history '{path}' was written by a newer ropescale (format {version}, this one writes "
            f"{HISTORY_FORMAT}); it is not replaced: use that version or another --output"
        )
    return data


def best_of(history: list[Trial]) -> Trial | None:
    """The recorded candidate with the lowest finite calibration perplexity (earliest on ties)."""
    finite = [c for c in history if math.isfinite(c["score"]["ppl"])]
    return min(finite, key=lambda c: (c["score"]["ppl"], c["index"])) if finite else None


def step_size(k: int) -> float:
    return STEP0 / math.sqrt(1 + k / 8)


def propose(space: Any, history: list[Trial], seed: int) -> tuple[Candidate, str, str | None]:
    """Candidate number ``len(history)``: (params, origin, note). Deterministic in (history, seed)."""
    k = len(history)
    seeds = space.seeds()
    if k < len(seeds):
        label, raw = seeds[k]
        params = space.project(raw, round_values=False)
        notes = ["projected onto the constraints"] if space.violations(raw) else []
        if getattr(space, "fixed_attention", None) is not None:
            notes.append(f"attention factor fixed at {space.fixed_attention:.6g} for every candidate")
        return params, f"seed:{label}", "; ".join(notes) or None
    rng = np.random.default_rng([seed, k])
    seen = {space.key(c["params"]) for c in history}
    ranked = sorted(
        (c for c in history if math.isfinite(c["score"]["ppl"])), key=lambda c: (c["score"]["ppl"], c["index"])
    )
    # parents: the best four, less any far behind the best (with a budget of tens of evaluations,
    # moves around a seed 3x worse than the best are wasted)
    pool = (
        [c for c in ranked[:4] if c["score"]["ppl"] <= POOL_RATIO * ranked[0]["score"]["ppl"]]
        if ranked
        else history[:1]
    )
    for _ in range(64):
        if len(pool) >= 2 and rng.random() < 0.25:
            a, b = rng.choice(len(pool), size=2, replace=False)
            params = space.crossover(pool[a]["params"], pool[b]["params"], rng)
            origin = f"crossover({pool[a]['index']},{pool[b]['index']})"
        else:
            parent = pool[0] if rng.random() < 0.5 else pool[int(rng.integers(len(pool)))]
            params, what = space.mutate(parent["params"], rng, step_size(k - len(seeds)))
            origin = f"mutate({parent['index']}:{what})"
        if space.key(params) not in seen:
            return params, origin, None
    if hasattr(space, "candidates"):  # a finite grid: any point not yet evaluated
        unseen = [c for c in space.candidates() if space.key(c) not in seen]
        if unseen:
            return unseen[int(rng.integers(len(unseen)))], "unseen", None
    raise RopescaleError("the search space is exhausted around the best candidates (64 proposals were duplicates)")


def run_search(
    space: Any,
    objective: Callable[[MethodParams], Score],
    budget: int,
    history_path: str | Path,
    settings: SearchSettings,
    seed: int = 0,
    progress: bool = True,
    on_record: Callable[[list[Trial]], None] | None = None,
) -> list[Trial]:
    """Evaluate candidates until ``budget`` are recorded in ``history_path``; return the history.

    Args:
        space: a :mod:`ropescale.search.space` space.
        objective: candidate's method parameters → :class:`Score` (lower ``ppl`` is better: perplexity or needle).
        budget: total evaluations, seeds included; a resumed search counts the recorded ones.
        history_path: the JSON history, rewritten atomically after every evaluation.
        settings: what identifies this search; a history with other settings is refused.
        seed: the random seed of the moves.
        progress: tqdm bar with the best so far.
        on_record: called with the history after each evaluation (e.g. to write the best config).
    """
    from tqdm.auto import tqdm

    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ValueError(f"budget must be a positive number of evaluations, got {budget!r}")
    history_path = Path(history_path)
    history = load_history(history_path, settings)
    # a finite grid (attention-level methods) ends the search once every point is evaluated
    budget = min(budget, getattr(space, "size", budget))
    bar = tqdm(total=max(budget, len(history)), initial=len(history), desc="search", unit="eval", disable=not progress)

    def show() -> None:
        best = best_of(history)
        if best is not None:
            bar.set_postfix_str(f"best {best['score']['ppl']:.3f} (#{best['index']} {best['origin']})")

    show()
    while len(history) < budget:
        params, origin, note = propose(space, history, seed)
        score = objective(space.method_params(params))
        record: Trial = {"index": len(history), "origin": origin, "params": params, "score": score.to_dict()}
        if note:
            record["note"] = note
        history.append(record)
        atomic_write_json(history_path, {"format": HISTORY_FORMAT, "settings": settings, "candidates": history})
        if on_record is not None:
            on_record(history)
        bar.update(1)
        show()
    bar.close()
    return history
