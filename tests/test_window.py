"""sliding-window: the blocked form of ``forward`` against the plain masked softmax
(``sliding_window_reference``) in float64, forward and backward, at lengths that do and do
not divide the block, for windows shorter than, equal to and longer than the block; the
reference itself against a per-position loop written from the docstring and against softmax
attention; the recurrent form at small windows; dtypes, large inputs, parameters, state."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from mechtools import CLOSE, LargestTensor, assert_same_function, lengths_around

from synthbench.core.mechanism import MECHANISMS, mechanism_params, recurrent_forward
from synthbench.mechanisms.window import sliding_window_reference

B, H, D = 2, 3, 8


@pytest.fixture(autouse=True)
def _one_thread(single_thread):
    """The tensors here are tiny: one intra-op thread is faster on a shared machine."""


def qkv(length, seed=0, dtype=torch.float64, requires_grad=False, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return tuple(
        (torch.randn(B, H, length, D, generator=g, dtype=dtype) * scale).requires_grad_(
            requires_grad
        )
        for _ in range(3)
    )


def build(**params):
    return MECHANISMS.get("sliding-window")(D, H, **params)


# (window, chunk_size): the defaults; window shorter than the block, equal, longer (reaching
# two blocks back); window 1; a window longer than every length tested
CONFIGS = [(64, 64), (5, 16), (16, 16), (40, 16), (1, 8), (500, 16)]


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize(("window", "chunk"), CONFIGS)
def test_blocked_form_equals_the_masked_softmax(window, chunk, causal):
    mechanism = build(window=window, chunk_size=chunk)
    for length in lengths_around(chunk):
        inputs = qkv(length, seed=length, requires_grad=True)
        assert_same_function(
            lambda q, k, v: mechanism(q, k, v, causal=causal),
            lambda q, k, v: sliding_window_reference(q, k, v, window, causal),
            inputs,
        )


def loop_reference(q, k, v, window, causal):
    """The docstring's formula, one position at a time."""
    length = q.shape[-2]
    out = torch.empty_like(v)
    for i in range(length):
        if causal:
            keys = range(max(0, i - window + 1), i + 1)
        else:
            keys = range(max(0, i - window + 1), min(length, i + window))
        keys = list(keys)
        scores = torch.einsum("bhd,bhjd->bhj", q[:, :, i], k[:, :, keys]) / math.sqrt(D)
        out[:, :, i] = torch.einsum("bhj,bhjd->bhd", scores.softmax(-1), v[:, :, keys])
    return out


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("window", [1, 3, 7, 30])
def test_reference_is_the_docstring_formula(window, causal):
    q, k, v = qkv(23, seed=3)
    expected = loop_reference(q, k, v, window, causal)
    torch.testing.assert_close(sliding_window_reference(q, k, v, window, causal), expected,
                               **CLOSE)  # fmt: skip
    torch.testing.assert_close(build(window=window, chunk_size=4)(q, k, v, causal), expected,
                               **CLOSE)  # fmt: skip


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_a_window_as_long_as_the_sequence_is_softmax_attention(causal):
    q, k, v = qkv(50, seed=4)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    out = build(window=50, chunk_size=16)(q, k, v, causal=causal)
    torch.testing.assert_close(out, expected, **CLOSE)


def test_window_one_returns_v():
    q, k, v = qkv(20, seed=5)
    torch.testing.assert_close(build(window=1)(q, k, v), v, **CLOSE)


def test_causal_is_the_full_band_without_later_keys():
    """The non-causal output differs, and the causal one ignores every later position."""
    mechanism = build(window=6, chunk_size=4)
    q, k, v = qkv(30, seed=6)
    causal, full = mechanism(q, k, v, causal=True), mechanism(q, k, v, causal=False)
    assert not torch.allclose(causal, full)
    changed = [x.clone() for x in (q, k, v)]
    for x in changed:
        x[:, :, 11:] = torch.randn_like(x[:, :, 11:])
    torch.testing.assert_close(mechanism(*changed, causal=True)[:, :, :11], causal[:, :, :11],
                               atol=0, rtol=0)  # fmt: skip


@pytest.mark.parametrize(("window", "chunk"), [(1, 64), (3, 4), (5, 64), (12, 5)])
def test_recurrent_form_at_windows_shorter_than_the_sequence(window, chunk):
    mechanism = build(window=window, chunk_size=chunk)
    q, k, v = qkv(17, seed=8, requires_grad=True)
    assert_same_function(lambda *x: recurrent_forward(mechanism, *x), mechanism, (q, k, v))


def test_recurrent_state_is_the_last_window_keys_and_values():
    mechanism = build(window=4)
    q, k, v = qkv(9, seed=9)
    state = mechanism.initial_state(B, q.device, q.dtype)
    for t in range(9):
        _, state = mechanism.step(state, q[:, :, t], k[:, :, t], v[:, :, t])
    keys, values, seen = state
    assert seen == 9 and keys.shape == (B, H, 4, D)
    torch.testing.assert_close(keys, k[:, :, 5:], atol=0, rtol=0)
    torch.testing.assert_close(values, v[:, :, 5:], atol=0, rtol=0)


def test_no_length_by_length_matrix():
    length, window = 512, 16
    q, k, v = qkv(length, seed=10, dtype=torch.float32)
    with LargestTensor() as seen:
        build(window=window, chunk_size=16)(q, k, v)
    # the block scores: each query against 2 blocks of 16 keys
    assert seen.largest <= B * H * length * 2 * 16 < B * H * length * length


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_dtypes(dtype):
    mechanism = build(window=10, chunk_size=8)
    q, k, v = (t.to(dtype) for t in qkv(45, seed=11, dtype=torch.float32))
    out = mechanism(q, k, v)
    assert out.dtype == dtype and out.shape == v.shape and bool(out.isfinite().all())
    expected = mechanism(q.double(), k.double(), v.double())
    tol = {"atol": 1e-2, "rtol": 1e-2} if dtype == torch.bfloat16 else {"atol": 1e-5, "rtol": 1e-5}
    torch.testing.assert_close(out.double(), expected, **tol)


def test_inputs_times_a_hundred_stay_finite():
    q, k, v = qkv(140, seed=12, dtype=torch.float32, requires_grad=True, scale=100.0)
    out = build()(q, k, v)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    assert bool(out.isfinite().all()) and all(bool(g.isfinite().all()) for g in grads)


@pytest.mark.parametrize(
    "params",
    [{"window": 0}, {"window": -3}, {"window": 2.5}, {"window": True}, {"chunk_size": 0}],
)
def test_invalid_parameters_are_refused(params):
    with pytest.raises(ValueError, match=next(iter(params))):
        build(**params)


def test_registration_and_state_size():
    entry = MECHANISMS.entry("sliding-window")
    assert MECHANISMS.get("swa") is MECHANISMS.get("window") is entry.obj
    assert entry.metadata["complexity"] == "linear"
    # Longformer's 512 of 4,096 at the suite's 128-token recall inputs (mechanisms/window.py)
    assert mechanism_params(entry.obj) == {"window": 128 // 8, "chunk_size": 64}
    mechanism = build(window=12)
    assert {mechanism.state_size(n) for n in (1, 12, 1000)} == {2 * 12 * D}
