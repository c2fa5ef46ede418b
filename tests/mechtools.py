"""Helpers of the tests of the chunked mechanisms (tests/test_window.py, test_retnet.py,
test_gla.py, test_mamba2.py, test_deltanet.py, test_based.py)."""

from __future__ import annotations

import random

import torch
from torch.overrides import TorchFunctionMode


def lengths_around(chunk):
    """1, chunk - 1, chunk, chunk + 1, 2 chunk + 3 and one drawn at random (seeded)."""
    drawn = random.Random(chunk).randint(2, 4 * chunk)
    return sorted({1, max(1, chunk - 1), chunk, chunk + 1, 2 * chunk + 3, drawn})


class LargestTensor(TorchFunctionMode):
    """The largest number of elements of any tensor a torch function returns."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out
