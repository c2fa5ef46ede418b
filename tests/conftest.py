"""Shared test fixtures."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def single_thread():
    """One torch thread: the models under test are tiny, and on a busy 2-core machine
    intra-op threads spend far longer waiting for each other than computing."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
