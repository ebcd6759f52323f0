"""Tiny models run single-threaded here: on a shared 2-core machine two threads spin against other
jobs and a 5 ms forward pass can take 300 ms."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
