"""One intra-op thread for the tiny models: on a busy 2-core machine torch's thread pool spends
far longer waiting for a core than computing a 64-wide matmul."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
