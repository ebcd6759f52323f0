"""Calibrated training-free extension: search per-pair rescale factors (LongRoPE), YaRN's parameters
or an attention-level method's (Self-Extend, DCA, STRING) for one model and target length, on
perplexity or on needle retrieval (:mod:`.needles`), seeded with the closed forms, resumable.

>>> from ropescale.search import SearchOptions, run_search_job, load_search
>>> run_search_job(SearchOptions(target_length=32768, budget=16), "runs/search")   # doctest: +SKIP
>>> ropescale.patch(model, load_search("runs/search").scaling())  # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from typing import Any

#: name -> the module that defines it, imported on first use (the command line imports
#: :mod:`.options` to build its parser without loading torch)
_LAZY = {
    "SearchResult": ".artifacts",
    "load_search": ".artifacts",
    "best_of": ".engine",
    "run_search": ".engine",
    "AttentionSpace": ".grid",
    "OBJECTIVES": ".options",
    "SearchOptions": ".options",
    "Text": ".pipeline",
    "run_search_job": ".pipeline",
    "search_model": ".pipeline",
    "LongRopeSpace": ".space",
    "YarnSpace": ".space",
    "make_space": ".space",
    "pair_factors": ".space",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = value
    return value


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
