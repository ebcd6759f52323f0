"""Calibrated training-free extension: search per-pair rescale factors (LongRoPE), YaRN's parameters
or an attention-level method's (Self-Extend, DCA, STRING) for one model and target length, on
perplexity or on needle retrieval (:mod:`.needles`), seeded with the closed forms, resumable.

>>> from ropescale.search import SearchOptions, run_search_job, load_search
>>> run_search_job(SearchOptions(target_length=32768, budget=16), "runs/search")   # doctest: +SKIP
>>> ropescale.patch(model, replace=True, **load_search("runs/search").patch_kwargs())  # doctest: +SKIP
"""

from __future__ import annotations

from .artifacts import SearchResult, load_search
from .engine import best_of, run_search
from .grid import AttentionSpace
from .needles import OBJECTIVES
from .pipeline import SearchOptions, Text, run_search_job, search_model
from .space import LongRopeSpace, YarnSpace, make_space, pair_factors

__all__ = [
    "OBJECTIVES",
    "AttentionSpace",
    "LongRopeSpace",
    "SearchOptions",
    "SearchResult",
    "Text",
    "YarnSpace",
    "best_of",
    "load_search",
    "make_space",
    "pair_factors",
    "run_search",
    "run_search_job",
    "search_model",
]
