"""retnet: the chunkwise form of ``forward`` against the parallel (masked quadratic) form
``retention_reference`` in float64, forward and backward, at lengths that do and do not
divide the chunk; both against a loop written from the docstring with gamma_h = 1 - 2^(-5-h)
computed here; the decays, the scale, the recurrent form at other chunk sizes; long sequences
and many heads in float32 (no overflow, decays distinct from 1), dtypes, large inputs,
causal only, parameters, state."""

from __future__ import annotations

import math

import pytest
import torch
from mechtools import CLOSE, LargestTensor, assert_same_function, lengths_around

from synthbench.core.mechanism import MECHANISMS, mechanism_params, recurrent_forward
from synthbench.mechanisms.retnet import retention_reference

B, H, D = 2, 3, 8


@pytest.fixture(autouse=True)
def _one_thread(single_thread):
    """The tensors here are tiny: one intra-op thread is faster on a shared machine."""


def qkv(length, seed=0, dtype=torch.float64, requires_grad=False, scale=1.0, heads=H):
    g = torch.Generator().manual_seed(seed)
    return tuple(
        (torch.randn(B, heads, length, D, generator=g, dtype=dtype) * scale).requires_grad_(
            requires_grad
        )
        for _ in range(3)
    )


def build(heads=H, **params):
    return MECHANISMS.get("retnet")(D, heads, **params)


def paper_gammas(heads):
    return [1 - 2.0 ** (-5 - h) for h in range(heads)]


def loop_reference(q, k, v):
    """The docstring's formula, term by term: o_t = sum_{s <= t} gamma_h^(t - s)
    (q_t . k_s / sqrt(d)) v_s, gamma_h = 1 - 2^(-5 - h)."""
    length = q.shape[-2]
    gammas = torch.tensor(paper_gammas(q.shape[1]), dtype=q.dtype).view(1, -1, 1)
    out = torch.zeros_like(v)
    for t in range(length):
        for s in range(t + 1):
            score = (q[:, :, t] * k[:, :, s]).sum(-1, keepdim=True) / math.sqrt(D)
            out[:, :, t] += gammas ** (t - s) * score * v[:, :, s]
    return out


@pytest.mark.parametrize("chunk", [64, 16, 5])
def test_chunkwise_form_equals_the_parallel_form(chunk):
    mechanism = build(chunk_size=chunk)
    for length in lengths_around(chunk):
        inputs = qkv(length, seed=length, requires_grad=True)
        assert_same_function(
            mechanism, lambda q, k, v: retention_reference(q, k, v, mechanism.log_decay), inputs
        )


def test_both_forms_are_the_docstring_formula():
    q, k, v = qkv(19, seed=3)
    expected = loop_reference(q, k, v)
    mechanism = build(chunk_size=4)
    torch.testing.assert_close(retention_reference(q, k, v, mechanism.log_decay), expected,
                               **CLOSE)  # fmt: skip
    torch.testing.assert_close(mechanism(q, k, v), expected, **CLOSE)


def test_decays_are_the_papers_and_fixed():
    mechanism = build(heads=6)
    expected = torch.tensor(paper_gammas(6), dtype=torch.float64)
    torch.testing.assert_close(mechanism.gamma, expected, atol=0, rtol=1e-15)
    assert mechanism.gamma[0] == 31 / 32 and mechanism.log_decay.dtype == torch.float64
    assert not list(mechanism.parameters())  # a buffer, not learned
    assert "log_decay" in dict(mechanism.named_buffers())


def test_q_is_scaled_by_the_inverse_square_root_of_head_dim():
    """At length 1: o_0 = (q_0 . k_0 / sqrt(d)) v_0."""
    q, k, v = qkv(1, seed=4)
    expected = (q * k).sum(-1, keepdim=True) / math.sqrt(D) * v
    torch.testing.assert_close(build()(q, k, v), expected, **CLOSE)


@pytest.mark.parametrize("chunk", [1, 3, 16])
def test_recurrent_form_at_other_chunk_sizes(chunk):
    mechanism = build(chunk_size=chunk).to(torch.float64)
    q, k, v = qkv(21, seed=5, requires_grad=True)
    assert_same_function(lambda *x: recurrent_forward(mechanism, *x), mechanism, (q, k, v))


def test_long_sequences_in_float32_match_the_float64_recurrence():
    """At the suite's longest length and far beyond it: no gamma^(-t), nothing overflows;
    the reference is the float64 recurrence, which has no powers at all."""
    reference = build(heads=2).to(torch.float64)
    for length, chunk in [(544, 64), (3000, 64), (3000, 1000)]:
        mechanism = build(heads=2, chunk_size=chunk)
        q, k, v = qkv(length, seed=6, dtype=torch.float32, heads=2)
        out = mechanism(q, k, v)
        assert out.dtype == torch.float32 and bool(out.isfinite().all())
        expected = recurrent_forward(reference, q.double(), k.double(), v.double())
        torch.testing.assert_close(out.double(), expected, atol=1e-4, rtol=1e-4)


def test_many_heads_keep_decays_below_one_in_float32():
    """Head 31 has gamma = 1 - 2^-36, which rounds to 1 in float32; its logarithm, the
    buffer, does not round to 0, so every gamma^(t-s) = exp((t-s) log gamma) stays a decay."""
    heads = 32
    mechanism = build(heads=heads).to(torch.float32)
    assert mechanism.log_decay.dtype == torch.float32 and bool((mechanism.log_decay < 0).all())
    q, k, v = qkv(70, seed=7, dtype=torch.float32, heads=heads)
    expected = loop_reference(q.double(), k.double(), v.double())
    torch.testing.assert_close(mechanism(q, k, v).double(), expected, atol=1e-4, rtol=1e-4)


def test_no_length_by_length_matrix():
    length = 512
    q, k, v = qkv(length, seed=8, dtype=torch.float32)
    with LargestTensor() as seen:
        build(chunk_size=16)(q, k, v)
    # the in-chunk scores, each query against its chunk of 16 keys
    assert seen.largest <= B * H * length * 16 < B * H * length * length


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_dtypes(dtype):
    mechanism = build(chunk_size=16)
    q, k, v = (t.to(dtype) for t in qkv(45, seed=9, dtype=torch.float32))
    out = mechanism(q, k, v)
    assert out.dtype == dtype and out.shape == v.shape and bool(out.isfinite().all())
    expected = mechanism(q.double(), k.double(), v.double())
    tol = {"atol": 2e-2, "rtol": 1e-2} if dtype == torch.bfloat16 else {"atol": 1e-5, "rtol": 1e-5}
    torch.testing.assert_close(out.double(), expected, **tol)


def test_inputs_times_a_hundred_stay_finite():
    q, k, v = qkv(544, seed=10, dtype=torch.float32, requires_grad=True, scale=100.0)
    out = build()(q, k, v)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    assert bool(out.isfinite().all()) and all(bool(g.isfinite().all()) for g in grads)


def test_causal_only():
    q, k, v = qkv(5)
    with pytest.raises(ValueError, match="retnet is causal only"):
        build()(q, k, v, causal=False)


@pytest.mark.parametrize("chunk_size", [0, -1, 2.0])
def test_invalid_chunk_size_is_refused(chunk_size):
    with pytest.raises(ValueError, match="chunk_size"):
        build(chunk_size=chunk_size)


def test_registration_and_state_size():
    entry = MECHANISMS.entry("retnet")
    assert MECHANISMS.get("retention") is entry.obj
    assert entry.metadata["complexity"] == "linear"
    assert mechanism_params(entry.obj) == {"chunk_size": 64}
    assert {build().state_size(n) for n in (1, 64, 1000)} == {D * D}
