"""deltanet: the chunkwise (WY / UT-transform) form of ``forward`` against the token-by-token
recurrence ``delta_rule_reference`` in float64, forward and backward (q, k, v and beta), at
lengths that do and do not divide the chunk; the reference against a loop written here from
the docstring; what the delta rule does (overwrite, not add); the recurrent form at other chunk
sizes; the layer's beta projection; long sequences, dtypes, large inputs, causal only,
parameters, state."""

from __future__ import annotations

import math

import pytest
import torch
from mechtools import CLOSE, LargestTensor, assert_same_function, lengths_around

from synthbench.core.mechanism import MECHANISMS, mechanism_params, recurrent_forward
from synthbench.core.model import MultiHeadAttention
from synthbench.mechanisms.deltanet import chunked_delta_rule, delta_rule_reference

B, H, D = 2, 3, 8


@pytest.fixture(autouse=True)
def _one_thread(single_thread):
    """The tensors here are tiny: one intra-op thread is faster on a shared machine."""


def inputs(length, seed=0, dtype=torch.float64, requires_grad=False, scale=1.0, heads=H):
    """q, k, v (B, heads, length, D) and beta (B, heads, length, 1), standard normal."""
    g = torch.Generator().manual_seed(seed)
    widths = (D, D, D, 1)
    return tuple(
        (torch.randn(B, heads, length, w, generator=g, dtype=dtype) * scale).requires_grad_(
            requires_grad
        )
        for w in widths
    )


INPUTS = ("q", "k", "v", "beta")  # what the tests differentiate


def build(heads=H, **params):
    return MECHANISMS.get("deltanet")(D, heads, **params)


def call(mechanism):
    return lambda q, k, v, beta: mechanism(q, k, v, beta=beta)


@pytest.mark.parametrize("chunk", [64, 16, 5, 1])
def test_chunkwise_form_equals_the_recurrence(chunk):
    mechanism = build(chunk_size=chunk)
    for length in lengths_around(chunk):
        args = inputs(length, seed=length, requires_grad=True)
        assert_same_function(call(mechanism), delta_rule_reference, args, names=INPUTS)


def loop_reference(q, k, v, beta):
    """The docstring, written again: k^ = k / sqrt(|k|^2 + 1e-6), q^ likewise times d^-1/2,
    b = 1 / (1 + e^-beta), S_t = (I - b k^ k^^T) S_{t-1} + b k^ v^T, o_t = S_t^T q^."""
    batch, heads, length, dim = q.shape
    out = torch.zeros_like(v)
    for x in range(batch):
        for h in range(heads):
            S = torch.zeros(dim, dim, dtype=q.dtype)
            for t in range(length):
                kt = k[x, h, t] / math.sqrt(float(k[x, h, t] @ k[x, h, t]) + 1e-6)
                qt = q[x, h, t] / math.sqrt(float(q[x, h, t] @ q[x, h, t]) + 1e-6) / math.sqrt(dim)
                b = 1 / (1 + math.exp(-float(beta[x, h, t, 0])))
                S = (torch.eye(dim, dtype=q.dtype) - b * torch.outer(kt, kt)) @ S
                S = S + b * torch.outer(kt, v[x, h, t])
                out[x, h, t] = S.mT @ qt
    return out


def test_both_forms_are_the_docstring_formula():
    q, k, v, beta = inputs(19, seed=3)
    expected = loop_reference(q, k, v, beta)
    torch.testing.assert_close(delta_rule_reference(q, k, v, beta), expected, **CLOSE)
    torch.testing.assert_close(chunked_delta_rule(q, k, v, beta, chunk_size=4), expected, **CLOSE)
    torch.testing.assert_close(build(chunk_size=6)(q, k, v, beta=beta), expected, **CLOSE)


def test_the_delta_rule_overwrites_what_a_key_stores():
    """b = 1 (beta 40: sigmoid rounds to 1 in float64), one-hot keys: writing v2 under the key
    of v1 replaces v1 (linear attention would add them); another key's value stays."""
    d = D
    e = torch.eye(d, dtype=torch.float64)
    v1, v2, v3 = (torch.randn(d, generator=torch.Generator().manual_seed(s), dtype=torch.float64)
                  for s in (1, 2, 3))  # fmt: skip
    k = torch.stack([e[0], e[1], e[0]])[None, None]  # positions 0, 1, 2
    v = torch.stack([v1, v3, v2])[None, None]
    q = torch.stack([e[0], e[1], e[0]])[None, None]
    beta = torch.full((1, 1, 3, 1), 40.0, dtype=torch.float64)
    out = build(heads=1)(q, k, v, beta=beta)[0, 0] * math.sqrt(d)  # undo the q scale
    shrink = 1 / (1 + 1e-6)  # |k^|^2: the eps inside the L2 normalisation
    torch.testing.assert_close(out[0], shrink * v1, **CLOSE)
    torch.testing.assert_close(out[1], shrink * v3, **CLOSE)
    # position 2 reads v2 (up to the eps): v1 is gone
    torch.testing.assert_close(out[2], shrink * (v2 + (1 - shrink) * v1), **CLOSE)


def test_q_and_k_are_normalised_and_q_scaled():
    """Scaling q or k by a positive number changes nothing (up to the eps); at length 1,
    o_0 = b (q^ . k^) v_0 with q^ carrying d^-1/2."""
    mechanism = build()
    q, k, v, beta = inputs(12, seed=4)
    base = mechanism(q, k, v, beta=beta)
    torch.testing.assert_close(mechanism(q * 7.0, k * 0.3, v, beta=beta), base, atol=1e-6,
                               rtol=1e-5)  # fmt: skip
    q1, k1, v1, b1 = (x[:, :, :1] for x in (q, k, v, beta))
    qn = q1 / (q1.square().sum(-1, keepdim=True) + 1e-6).sqrt() / math.sqrt(D)
    kn = k1 / (k1.square().sum(-1, keepdim=True) + 1e-6).sqrt()
    expected = torch.sigmoid(b1) * (qn * kn).sum(-1, keepdim=True) * v1
    torch.testing.assert_close(mechanism(q1, k1, v1, beta=b1), expected, **CLOSE)


@pytest.mark.parametrize("chunk", [1, 3, 16])
def test_recurrent_form_at_other_chunk_sizes(chunk):
    mechanism = build(chunk_size=chunk).to(torch.float64)
    args = inputs(21, seed=5, requires_grad=True)
    assert_same_function(
        lambda q, k, v, beta: recurrent_forward(mechanism, q, k, v, beta=beta),
        call(mechanism),
        args,
        names=INPUTS,
    )


def test_the_layer_projects_beta():
    torch.manual_seed(0)
    layer = MultiHeadAttention(16, 2, build(heads=2))
    assert layer.extra.out_features == 2  # one beta per head
    x = torch.randn(3, 20, 16)
    y = layer(x)
    assert y.shape == x.shape
    assert torch.autograd.grad(y.sum(), layer.extra.weight)[0].abs().sum() > 0


def test_long_sequences_in_float32_match_the_float64_recurrence():
    reference = build(heads=2).to(torch.float64)
    for length, chunk in [(544, 64), (2000, 64)]:
        q, k, v, beta = inputs(length, seed=6, dtype=torch.float32, heads=2)
        out = build(heads=2, chunk_size=chunk)(q, k, v, beta=beta)
        assert out.dtype == torch.float32 and bool(out.isfinite().all())
        expected = recurrent_forward(reference, *(x.double() for x in (q, k, v)),
                                     beta=beta.double())  # fmt: skip
        torch.testing.assert_close(out.double(), expected, atol=1e-4, rtol=1e-4)


def test_no_length_by_length_matrix():
    length = 512
    q, k, v, beta = inputs(length, seed=8, dtype=torch.float32)
    with LargestTensor() as seen:
        build(chunk_size=16)(q, k, v, beta=beta)
    # the in-chunk matrices (each query against its chunk of 16 keys), the (d x d) states
    assert seen.largest <= B * H * length * max(16, D) < B * H * length * length


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_dtypes(dtype):
    mechanism = build(chunk_size=16)
    q, k, v, beta = (t.to(dtype) for t in inputs(45, seed=9, dtype=torch.float32))
    out = mechanism(q, k, v, beta=beta)
    assert out.dtype == dtype and out.shape == v.shape and bool(out.isfinite().all())
    expected = mechanism(q.double(), k.double(), v.double(), beta=beta.double())
    tol = {"atol": 2e-2, "rtol": 1e-2} if dtype == torch.bfloat16 else {"atol": 1e-5, "rtol": 1e-5}
    torch.testing.assert_close(out.double(), expected, **tol)


def test_inputs_times_a_hundred_stay_finite():
    args = inputs(544, seed=10, dtype=torch.float32, requires_grad=True, scale=100.0)
    q, k, v, beta = args
    out = build()(q, k, v, beta=beta)
    grads = torch.autograd.grad(out.square().sum(), args)
    assert bool(out.isfinite().all()) and all(bool(g.isfinite().all()) for g in grads)


def test_causal_only_and_beta_required():
    assert MECHANISMS.get("deltanet").causal_only
    q, k, v, beta = inputs(5)
    with pytest.raises(ValueError, match="deltanet is causal only"):
        build()(q, k, v, causal=False, beta=beta)
    with pytest.raises(ValueError, match="beta"):
        build()(q, k, v)


@pytest.mark.parametrize("chunk_size", [0, -1, 2.0, True])
def test_invalid_chunk_size_is_refused(chunk_size):
    with pytest.raises(ValueError, match="chunk_size"):
        build(chunk_size=chunk_size)


def test_registration_and_state_size():
    entry = MECHANISMS.entry("deltanet")
    assert MECHANISMS.get("delta-rule") is entry.obj
    assert entry.metadata["complexity"] == "linear"
    assert entry.metadata["family"] == "delta-rule"
    assert mechanism_params(entry.obj) == {"chunk_size": 64}
    mechanism = build()
    assert mechanism.extra_inputs == {"beta": 1}
    assert not list(mechanism.parameters())
    assert {mechanism.state_size(n) for n in (1, 64, 1000)} == {D * D}
