"""Helpers of the tests of the chunked mechanisms (tests/test_window.py, test_retnet.py,
test_gla.py, test_mamba2.py, test_deltanet.py, test_based.py); assert_same_function is
the forward-and-gradient comparison of a chunked form with its reference."""

from __future__ import annotations

import random

import torch
from torch.overrides import TorchFunctionMode

CLOSE = {"atol": 1e-10, "rtol": 1e-9}  # float64: the chunked form against its reference


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


def assert_same_function(fn, reference, inputs, tol=CLOSE, names="qkv", params=()):
    """Forward, and the gradients of a random weighting of the output w.r.t. every input
    (``names``: q, k, v and any extra input, in order) and every parameter in ``params``
    (named by ``names`` too), each finite and equal to the reference's."""
    weight = torch.randn(inputs[2].shape, generator=torch.Generator().manual_seed(7),
                         dtype=inputs[2].dtype)  # fmt: skip
    wrt = (*inputs, *params)
    results = []
    for f in (fn, reference):
        out = f(*inputs)
        results.append((out, torch.autograd.grad((out * weight).sum(), wrt)))
    (out, grads), (expected, expected_grads) = results
    torch.testing.assert_close(out, expected, **tol)
    for name, grad, expected_grad in zip(names, grads, expected_grads, strict=True):
        assert bool(grad.isfinite().all()), f"gradient w.r.t. {name} not finite"
        torch.testing.assert_close(grad, expected_grad, **tol, msg=f"gradient w.r.t. {name}")
