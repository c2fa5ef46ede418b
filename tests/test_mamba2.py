"""mamba2: the chunked SSD form of ``forward`` (``chunked_ssd``) against the token-by-token
recurrence ``ssd_reference`` in float64, forward and backward (q, k, v, dt, A_log and
dt_bias), at lengths that do and do not divide the chunk, with the initial and with strong
decays; the reference against a loop written here from the docstring's unrolled formula; no
scale; the initialisation (Mamba-2's, from torch's global generator); segsum; the recurrent form
at other chunk sizes; the layer's dt projection; long sequences, dtypes, large inputs, causal
only, parameters, state."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from mechtools import CLOSE, LargestTensor, assert_same_function, lengths_around

from synthbench.core.mechanism import MECHANISMS, mechanism_params, recurrent_forward
from synthbench.core.model import MultiHeadAttention
from synthbench.mechanisms.mamba2 import (
    SEGMENT_PRODUCT_MAX,
    chunked_ssd,
    segsum,
    segsum_exp,
    ssd_reference,
    sums_to_end,
)

B, H, D = 2, 3, 8


@pytest.fixture(autouse=True)
def _one_thread(single_thread):
    """The tensors here are tiny: one intra-op thread is faster on a shared machine."""


def inputs(length, seed=0, dtype=torch.float64, requires_grad=False, scale=1.0, heads=H):
    """q, k, v (B, heads, length, D) and dt (B, heads, length, 1), standard normal."""
    g = torch.Generator().manual_seed(seed)
    return tuple(
        (torch.randn(B, heads, length, w, generator=g, dtype=dtype) * scale).requires_grad_(
            requires_grad
        )
        for w in (D, D, D, 1)
    )


def build(heads=H, dtype=torch.float64, **params):
    torch.manual_seed(0)
    return MECHANISMS.get("mamba2")(D, heads, **params).to(dtype)


def strong(mechanism):
    """The same mechanism with decays from strong to total: A from e^0 to e^4 and
    softplus(dt_bias) about 0.3 to 3: exp(Delta A) per step from about 0.7 down to e^-160,
    products that underflow to 0 within a chunk."""
    with torch.no_grad():
        mechanism.A_log.copy_(torch.linspace(0, 4, mechanism.n_heads))
        mechanism.dt_bias.copy_(torch.linspace(-1, 3, mechanism.n_heads))
    return mechanism


def wrt(mechanism):
    """assert_same_function's names and parameters: the inputs and A_log and dt_bias."""
    names = ("q", "k", "v", "dt", "A_log", "dt_bias")
    return {"names": names, "params": (mechanism.A_log, mechanism.dt_bias)}


def reference_of(mechanism):
    return lambda q, k, v, dt: ssd_reference(q, k, v, dt, mechanism.A_log, mechanism.dt_bias)


def call(mechanism):
    return lambda q, k, v, dt: mechanism(q, k, v, dt=dt)


def loop_reference(q, k, v, dt, A_log, dt_bias):  # noqa: N803
    """The docstring's unrolled formula, term by term, with a_r = exp(-Delta_r exp(A_log)):
    o_t = sum_{s <= t} (q_t . k_s) (prod_{s < r <= t} a_r) Delta_s v_s."""
    delta = F.softplus(dt[..., 0] + dt_bias.view(-1, 1))  # (B, H, L)
    a = torch.exp(-delta * torch.exp(A_log).view(-1, 1))
    out = torch.zeros_like(v)
    for t in range(q.shape[-2]):
        decay = torch.ones_like(a[:, :, 0])
        for s in range(t, -1, -1):
            score = (q[:, :, t] * k[:, :, s]).sum(-1) * decay * delta[:, :, s]
            out[:, :, t] += score.unsqueeze(-1) * v[:, :, s]
            decay = decay * a[:, :, s]
    return out


@pytest.mark.parametrize("decays", ["initial", "strong"])
@pytest.mark.parametrize("chunk", [64, 16, 5])
def test_chunked_form_equals_the_recurrence(chunk, decays):
    mechanism = build(chunk_size=chunk)
    if decays == "strong":
        strong(mechanism)
    for length in lengths_around(chunk):
        args = inputs(length, seed=length, requires_grad=True)
        assert_same_function(call(mechanism), reference_of(mechanism), args, **wrt(mechanism))


def test_the_chunked_function_at_chunk_sizes_that_do_not_divide():
    mechanism = strong(build())
    args = inputs(50, seed=1, requires_grad=True)
    for chunk in (1, 3, 7, 49, 50, 51):
        assert_same_function(
            lambda q, k, v, dt, chunk=chunk: chunked_ssd(
                q, k, v, dt, mechanism.A_log, mechanism.dt_bias, chunk
            ),
            reference_of(mechanism),
            args,
            **wrt(mechanism),
        )


def test_both_forms_are_the_docstring_formula():
    mechanism = build(chunk_size=4)
    with torch.no_grad():  # decays from about 0.9 to 0.05 per step
        mechanism.A_log.copy_(torch.tensor([0.0, 1.0, 2.0]))
        mechanism.dt_bias.copy_(torch.tensor([-2.0, -0.5, 0.5]))
    q, k, v, dt = inputs(19, seed=3)
    expected = loop_reference(q, k, v, dt, mechanism.A_log, mechanism.dt_bias)
    torch.testing.assert_close(reference_of(mechanism)(q, k, v, dt), expected, **CLOSE)
    torch.testing.assert_close(mechanism(q, k, v, dt=dt), expected, **CLOSE)


def test_q_is_not_scaled():
    """At length 1: o_0 = (q_0 . k_0) Delta_0 v_0, Delta_0 = softplus(dt_0 + dt_bias)."""
    mechanism = build()
    q, k, v, dt = inputs(1, seed=4)
    delta = F.softplus(dt + mechanism.dt_bias.view(1, -1, 1, 1))
    expected = (q * k).sum(-1, keepdim=True) * delta * v
    torch.testing.assert_close(mechanism(q, k, v, dt=dt), expected, **CLOSE)


def test_initialisation_is_mamba2s_from_the_global_generator():
    """dt drawn first, log-uniform in [1e-3, 1e-1], stored as its inverse softplus; then
    A ~ uniform[1, 16], stored as log A; float32 parameters of shape (n_heads,)."""
    heads = 64
    torch.manual_seed(3)
    dt0 = torch.exp(torch.rand(heads) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
    a0 = torch.empty(heads).uniform_(1, 16)
    torch.manual_seed(3)
    mechanism = MECHANISMS.get("mamba2")(D, heads)
    assert dict(mechanism.named_parameters()).keys() == {"A_log", "dt_bias"}
    for p in mechanism.parameters():
        assert p.shape == (heads,) and p.dtype == torch.float32 and p.requires_grad
    torch.testing.assert_close(F.softplus(mechanism.dt_bias), dt0, atol=0, rtol=1e-5)
    torch.testing.assert_close(mechanism.A_log.exp(), a0, atol=0, rtol=1e-6)
    delta, a = F.softplus(mechanism.dt_bias), mechanism.A_log.exp()
    assert bool((delta >= 1e-3 * (1 - 1e-6)).all() and (delta <= 0.1 * (1 + 1e-6)).all())
    assert bool((a >= 1).all() and (a <= 16).all())
    torch.manual_seed(3)
    again = MECHANISMS.get("mamba2")(D, heads)
    assert torch.equal(again.A_log, mechanism.A_log)
    assert torch.equal(again.dt_bias, mechanism.dt_bias)
    other = MECHANISMS.get("mamba2")(D, heads)  # the generator moved on: another draw
    assert not torch.equal(other.A_log, mechanism.A_log)


def test_segsum():
    x = torch.tensor([[0.5, -1.0, -2.0, -0.25]], dtype=torch.float64)
    out = segsum(x)
    for i in range(4):
        for j in range(4):
            expected = x[0, j + 1 : i + 1].sum() if j <= i else -math.inf
            assert out[0, i, j] == expected
    # masked before the cumulative sum: -1e30 in a segment does not reach the others
    far = torch.tensor([-1.0, -1e30, -1.0, -1.0], dtype=torch.float64, requires_grad=True)
    decays = segsum(far).exp()
    assert decays[3, 2] == math.exp(-1.0) and decays[1, 0] == 0
    (grad,) = torch.autograd.grad(decays.sum(), far)
    assert bool(grad.isfinite().all())


@pytest.mark.parametrize("length", [1, 5, SEGMENT_PRODUCT_MAX, SEGMENT_PRODUCT_MAX + 1])
def test_segsum_exp_and_sums_to_end_are_segsums(length):
    """The chunked forms' decays, on both of segsum_exp's paths (one product up to
    SEGMENT_PRODUCT_MAX positions, the cumulative sum past it): exp(segsum), 0 above the
    diagonal, and segsum's last row; forward and gradients, float64."""
    x = -torch.rand(3, length, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    x.requires_grad_(True)
    weights = torch.randn(3, length, length, dtype=torch.float64)
    fast = segsum_exp(x)
    plain = segsum(x).exp()
    torch.testing.assert_close(fast, plain, rtol=1e-13, atol=1e-15)
    assert bool((fast.triu(1) == 0).all())
    grads = [torch.autograd.grad((d * weights).sum(), x)[0] for d in (fast, segsum(x).exp())]
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(sums_to_end(x), segsum(x)[:, -1, :], rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("length", [4, SEGMENT_PRODUCT_MAX + 1])
@pytest.mark.parametrize("far", [-1e30, -math.inf])
def test_segsum_exp_keeps_a_far_decay_to_its_segments(length, far):
    """An overflowed decay (-inf) or a huge one in a segment reaches no other segment, on
    both paths, and leaves every gradient finite, as segsum does."""
    x = torch.full((length,), -1.0, dtype=torch.float64)
    x[1] = far
    x.requires_grad_(True)
    decays = segsum_exp(x)
    assert decays[3, 2] == math.exp(-1.0) and decays[1, 0] == 0 and decays[2, 1] == math.exp(-1.0)
    (grad,) = torch.autograd.grad(decays.sum(), x)
    assert bool(grad.isfinite().all())


@pytest.mark.parametrize("chunk", [1, 3, 16])
def test_recurrent_form_at_other_chunk_sizes(chunk):
    mechanism = strong(build(chunk_size=chunk))
    args = inputs(21, seed=6, requires_grad=True)
    assert_same_function(
        lambda q, k, v, dt: recurrent_forward(mechanism, q, k, v, dt=dt),
        call(mechanism),
        args,
        **wrt(mechanism),
    )


def test_the_layer_projects_one_dt_per_head():
    torch.manual_seed(0)
    layer = MultiHeadAttention(16, 2, MECHANISMS.get("mamba2")(8, 2))
    assert layer.extra_widths == {"dt": 1} and layer.extra.out_features == 2
    x = torch.randn(3, 70, 16)
    y = layer(x)
    assert y.shape == x.shape
    grads = torch.autograd.grad(y.sum(), [layer.extra.weight, *layer.mechanism.parameters()])
    assert all(g.abs().sum() > 0 for g in grads)


def test_long_sequences_in_float32_match_the_float64_recurrence():
    """Far beyond the suite's longest length, and with one chunk of 1000: only decays <= 1
    are ever exponentiated, nothing overflows."""
    reference = build(heads=2)
    for length, chunk in [(544, 64), (3000, 64), (3000, 1000)]:
        mechanism = build(heads=2, dtype=torch.float32, chunk_size=chunk)
        args = inputs(length, seed=7, dtype=torch.float32, heads=2)
        out = mechanism(*args[:3], dt=args[3])
        assert out.dtype == torch.float32 and bool(out.isfinite().all())
        q, k, v, dt = (t.double() for t in args)
        expected = recurrent_forward(reference, q, k, v, dt=dt)
        torch.testing.assert_close(out.double(), expected, atol=1e-4, rtol=1e-4)


def test_no_length_by_length_matrix():
    length = 512
    mechanism = build(dtype=torch.float32, chunk_size=16)
    q, k, v, dt = inputs(length, seed=8, dtype=torch.float32)
    with LargestTensor() as seen:
        mechanism(q, k, v, dt=dt)
    # the in-chunk scores, each query against its chunk of 16 keys
    assert seen.largest <= B * H * length * 16 < B * H * length * length


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_dtypes(dtype):
    mechanism = strong(build(dtype=torch.float32, chunk_size=16))  # parameters as built
    q, k, v, dt = (t.to(dtype) for t in inputs(45, seed=9, dtype=torch.float32))
    out = mechanism(q, k, v, dt=dt)
    assert out.dtype == dtype and out.shape == v.shape and bool(out.isfinite().all())
    expected = mechanism(q.double(), k.double(), v.double(), dt=dt.double())
    tol = {"atol": 2e-2, "rtol": 1e-2} if dtype == torch.bfloat16 else {"atol": 1e-5, "rtol": 1e-5}
    torch.testing.assert_close(out.double(), expected, **tol)


@pytest.mark.parametrize("decays", ["initial", "strong"])
def test_inputs_times_a_hundred_stay_finite(decays):
    mechanism = build(dtype=torch.float32)
    if decays == "strong":
        strong(mechanism)
    args = inputs(544, seed=10, dtype=torch.float32, requires_grad=True, scale=100.0)
    out = mechanism(*args[:3], dt=args[3])
    grads = torch.autograd.grad(out.sum(), [*args, *mechanism.parameters()])
    assert bool(out.isfinite().all()) and all(bool(g.isfinite().all()) for g in grads)


def test_causal_only_and_dt_required():
    q, k, v, dt = inputs(5)
    with pytest.raises(ValueError, match="mamba2 is causal only"):
        build()(q, k, v, causal=False, dt=dt)
    with pytest.raises(ValueError, match="extra input dt"):
        build()(q, k, v)


@pytest.mark.parametrize("chunk_size", [0, -1, 2.0])
def test_invalid_chunk_size_is_refused(chunk_size):
    with pytest.raises(ValueError, match="chunk_size"):
        build(chunk_size=chunk_size)


def test_registration_and_state_size():
    entry = MECHANISMS.entry("mamba2")
    assert MECHANISMS.get("ssd") is entry.obj
    assert entry.metadata["complexity"] == "linear"
    assert entry.metadata["family"] == "ssm"
    assert mechanism_params(entry.obj) == {"chunk_size": 64}
    mechanism = build()
    assert mechanism.extra_inputs == {"dt": 1}
    assert {mechanism.state_size(n) for n in (1, 64, 1000)} == {D * D}
