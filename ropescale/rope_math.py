"""Closed forms that several rooms need, written once.

``yarn_mscale`` is YaRN's attention temperature (arXiv 2309.00071, eq. 22): the methods use it to scale
attention, the interop rules to say what an engine computes from a config, the search to seed its
attention factor and the reports to print it. It lives on the ground floor so that ``methods`` and
``interop`` (rooms on the same floor, which may not import each other) share one definition.
"""

from __future__ import annotations

import math


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """0.1·m·ln(s) + 1, and 1 for s ≤ 1 (YaRN eq. 22; DeepSeek's ``get_mscale``)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0
