"""s4d: the chunked form against the step-by-step recurrence and against an independent
real-pair recurrence written here from the paper's equations (float64, forward and backward,
every parameter), at lengths that do and do not divide the chunk; the kernel as an explicit
convolution; time invariance and independence of q and k; the source's initial values and
weight-decay marks; the published layer (S4D's block) against its parts and its recurrent
form; dtypes, long sequences, options."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from mechtools import CLOSE, LargestTensor, lengths_around

from synthbench.core.layer import layer_of, layer_params, recurrent_layer_forward
from synthbench.core.mechanism import MECHANISMS, mechanism_params, recurrent_forward
from synthbench.mechanisms.s4d import S4D, S4DLayer, discretised, s4d_reference, ssm_kernel

B, H, D = 2, 3, 8
PARAM_NAMES = ("log_dt", "log_A_real", "A_imag", "B", "C", "D")


@pytest.fixture(autouse=True)
def _one_thread(single_thread):
    """The tensors here are tiny: one intra-op thread is faster on a shared machine."""


def build(dtype=torch.float64, seed=0, **params) -> S4D:
    """The mechanism, then moved off its neutral start: Delta spread over [0.02, 1.5] (fast
    and slow decays), Re(A) over [-0.1, -2], B drawn, so that every parameter matters."""
    torch.manual_seed(seed)
    mechanism = MECHANISMS.get("s4d")(D, H, **params).to(dtype)
    ssm = mechanism.ssm
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        ssm.log_dt.copy_(torch.linspace(math.log(0.02), math.log(1.5), H * D).view(H, D))
        ssm.log_A_real.copy_(torch.empty(ssm.log_A_real.shape).uniform_(-2.3, 0.7, generator=g))
        ssm.B.copy_(torch.randn(ssm.B.shape, generator=g, dtype=torch.float64))
    return mechanism


def values(length, seed=0, dtype=torch.float64, requires_grad=False, heads=H):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, heads, length, D, generator=g, dtype=dtype).requires_grad_(requires_grad)


def pair_recurrence(v, ssm):
    """The paper's recurrence in real arithmetic, each mode a pair (re, im), written from the
    equations alone: A = -exp(log_A_real) + i A_imag, Abar = exp(Delta A), Bbar = B (Abar - 1)
    / A, x_t = Abar x_{t-1} + Bbar u_t, y_t = 2 Re(C . x_t) + D u_t."""
    dt = ssm.log_dt.exp().unsqueeze(-1)  # (H, d, 1)
    a_re, a_im = -ssm.log_A_real.exp(), ssm.A_imag
    magnitude = torch.exp(dt * a_re)
    abar_re, abar_im = magnitude * torch.cos(dt * a_im), magnitude * torch.sin(dt * a_im)
    # (Abar - 1) / A = (Abar - 1) conj(A) / |A|^2
    num_re, num_im = abar_re - 1, abar_im
    norm = a_re**2 + a_im**2
    q_re = (num_re * a_re + num_im * a_im) / norm
    q_im = (num_im * a_re - num_re * a_im) / norm
    b_re, b_im = ssm.B[..., 0], ssm.B[..., 1]
    bbar_re, bbar_im = b_re * q_re - b_im * q_im, b_re * q_im + b_im * q_re
    c_re, c_im = ssm.C[..., 0], ssm.C[..., 1]
    x_re = torch.zeros(v.shape[0], *abar_re.shape, dtype=v.dtype)
    x_im = torch.zeros_like(x_re)
    outs = []
    for t in range(v.shape[2]):
        u = v[:, :, t].unsqueeze(-1)
        x_re, x_im = (
            abar_re * x_re - abar_im * x_im + bbar_re * u,
            abar_re * x_im + abar_im * x_re + bbar_im * u,
        )
        read = (c_re * x_re - c_im * x_im).sum(-1)  # Re(C . x)
        outs.append(2 * read + ssm.D * v[:, :, t])
    return torch.stack(outs, dim=2)


def assert_same_function(fn, reference, v, parameters, tol=CLOSE):
    """Outputs, and gradients of a random weighting of them w.r.t. v and every parameter."""
    weight = torch.randn(v.shape, generator=torch.Generator().manual_seed(7), dtype=v.dtype)
    wrt = (v, *parameters)
    results = []
    for f in (fn, reference):
        out = f(v)
        results.append((out, torch.autograd.grad((out * weight).sum(), wrt)))
    (out, grads), (expected, expected_grads) = results
    torch.testing.assert_close(out, expected, **tol)
    for name, grad, want in zip(("v", *PARAM_NAMES), grads, expected_grads, strict=True):
        assert bool(grad.isfinite().all()), f"gradient w.r.t. {name} not finite"
        torch.testing.assert_close(grad, want, **tol, msg=f"gradient w.r.t. {name}")


@pytest.mark.parametrize("chunk", [64, 16, 5])
def test_chunked_form_equals_both_step_by_step_recurrences(chunk):
    mechanism = build(chunk_size=chunk)
    ssm = mechanism.ssm
    parameters = [getattr(ssm, name) for name in PARAM_NAMES]
    for length in lengths_around(chunk):
        v = values(length, seed=length, requires_grad=True)
        forward = lambda x: mechanism(x, x, x)  # noqa: E731 - q and k are not read
        assert_same_function(forward, lambda x: s4d_reference(x, ssm.params()), v, parameters)
        assert_same_function(forward, lambda x: pair_recurrence(x, ssm), v, parameters)


@pytest.mark.parametrize("init", ["lin", "inv"])
def test_recurrent_form_equals_forward(init):
    mechanism = build(init=init, chunk_size=7)
    ssm = mechanism.ssm
    parameters = [getattr(ssm, name) for name in PARAM_NAMES]
    v = values(30, seed=3, requires_grad=True)
    assert_same_function(
        lambda x: recurrent_forward(mechanism, x, x, x), lambda x: mechanism(x, x, x), v, parameters
    )


def test_the_output_is_a_causal_convolution_with_the_ssm_kernel():
    """y_t = sum_{s <= t} K_(t-s) u_s + D u_t, the convolution built here as an explicit
    lower-triangular Toeplitz matrix from K (itself checked against its impulse response)."""
    mechanism = build(chunk_size=6)
    ssm = mechanism.ssm
    length = 25
    v = values(length, seed=4)
    impulse = torch.zeros(1, H, length, D, dtype=torch.float64)
    impulse[:, :, 0] = 1.0
    response = pair_recurrence(impulse, ssm)[0] - ssm.D.detach().unsqueeze(1) * impulse[0]
    dt_a, b_bar, c = discretised(ssm.params(), torch.float64)
    kernel = ssm_kernel(dt_a, c * b_bar, length)  # (H, d, L)
    torch.testing.assert_close(kernel, response.permute(0, 2, 1).detach(), **CLOSE)
    lags = torch.arange(length)[:, None] - torch.arange(length)[None, :]
    toeplitz = kernel[..., lags.clamp(min=0)] * (lags >= 0)
    expected = torch.einsum("hdts,bhsd->bhtd", toeplitz, v) + ssm.D.detach()[:, None, :] * v
    torch.testing.assert_close(mechanism(v, v, v).detach(), expected, **CLOSE)


def test_time_invariant_and_blind_to_q_and_k():
    """The same kernel at every position: an input delayed by s positions (zeros first) gives
    the output delayed by s; and q and k change nothing (no input reaches A, B, C, Delta)."""
    mechanism = build(chunk_size=8)
    v = values(30, seed=5)
    out = mechanism(v, v, v).detach()
    for delay in (1, 7, 19):
        delayed = F.pad(v, (0, 0, delay, 0))
        shifted = mechanism(delayed, delayed, delayed).detach()
        torch.testing.assert_close(shifted[:, :, delay:], out, **CLOSE)
        torch.testing.assert_close(shifted[:, :, :delay], torch.zeros_like(shifted[:, :, :delay]))
    other_q, other_k = values(30, seed=6), values(30, seed=7)
    torch.testing.assert_close(mechanism(other_q, other_k, v).detach(), out, atol=0, rtol=0)


def test_initial_values_are_the_sources():
    torch.manual_seed(0)
    lin = MECHANISMS.get("s4d")(16, 4)
    ssm = lin.ssm
    n = torch.arange(32, dtype=torch.float32)
    torch.testing.assert_close(ssm.A_imag, (math.pi * n).expand(4, 16, 32))  # S4D-Lin
    torch.testing.assert_close(ssm.log_A_real.exp(), torch.full((4, 16, 32), 0.5))  # Re A = -1/2
    torch.testing.assert_close(ssm.B, torch.stack([torch.ones(4, 16, 32), torch.zeros(4, 16, 32)],
                                                  dim=-1))  # fmt: skip
    dt = ssm.log_dt.exp()
    assert bool((dt >= 1e-3).all()) and bool((dt <= 1e-1).all()) and dt.std() > 0
    assert ssm.C.shape == (4, 16, 32, 2) and abs(float(ssm.C.detach().var()) - 0.5) < 0.1
    assert ssm.D.shape == (4, 16) and abs(float(ssm.D.detach().std()) - 1) < 0.3
    inv = MECHANISMS.get("s4d")(16, 4, init="inv", d_state=8).ssm.A_imag[0, 0]
    expected = [8 / math.pi * (8 / (2 * k + 1) - 1) for k in range(4)]  # S4D-Inv, N = 8
    torch.testing.assert_close(inv, torch.tensor(expected, dtype=torch.float32))
    decayed = {name for name, p in lin.named_parameters() if not getattr(p, "_no_weight_decay", 0)}
    assert decayed == {"ssm.C", "ssm.D"}  # A, B and Delta have weight decay 0 in the source


def test_chunk_size_changes_nothing_and_no_length_by_length_matrix():
    v = values(150, seed=8)
    outputs = [build(chunk_size=c)(v, v, v).detach() for c in (1, 13, 64, 150)]
    for other in outputs[1:]:
        torch.testing.assert_close(other, outputs[0], **CLOSE)
    with LargestTensor() as seen:
        build(chunk_size=16)(v, v, v)
    assert seen.largest < B * H * 150 * 150 * D


def test_long_sequences_in_float32_match_the_float64_recurrence():
    """Modes that hardly decay (Delta 1e-3) and fast ones, far beyond the suite's lengths:
    every power of Abar has modulus <= 1, nothing overflows."""
    reference = build()
    mechanism = build(dtype=torch.float32)
    with torch.no_grad():
        for ssm in (reference.ssm, mechanism.ssm):
            ssm.log_dt[0].fill_(math.log(1e-3))
    v = values(3000, seed=9, dtype=torch.float32)
    out = mechanism(v, v, v)
    assert out.dtype == torch.float32 and bool(out.isfinite().all())
    expected = s4d_reference(v.double(), reference.ssm.params())
    torch.testing.assert_close(out.double(), expected, atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dtypes_come_back_as_given(dtype):
    mechanism = build(dtype=torch.float32, chunk_size=16)
    v = values(45, seed=10, dtype=torch.float32).to(dtype)
    out = mechanism(v, v, v)
    assert out.dtype == dtype and bool(out.isfinite().all())
    expected = mechanism(v.float(), v.float(), v.float())
    torch.testing.assert_close(out.float(), expected, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize(
    "params, message",
    [
        ({"d_state": 7}, "d_state must be even"),
        ({"d_state": 0}, "d_state must be an integer >= 2"),
        ({"init": "legs"}, "init must be one of lin, inv"),
        ({"dt_min": 0.1, "dt_max": 0.01}, "dt_max 0.01 must be >= dt_min 0.1"),
        ({"dt_min": 0}, "dt_min must be a number > 0"),
        ({"chunk_size": 0}, "chunk_size"),
    ],
)
def test_bad_options_are_refused_in_one_line(params, message):
    with pytest.raises(ValueError, match=message):
        MECHANISMS.get("s4d")(D, H, **params)
    with pytest.raises(ValueError, match=message):
        S4DLayer(16, 2, **params)


def test_causal_only_registered_and_state_size():
    v = values(5)
    with pytest.raises(ValueError, match="s4d is causal only"):
        build()(v, v, v, causal=False)
    entry = MECHANISMS.entry("s4d")
    assert entry.metadata["complexity"] == "linear" and "2206.11893" in entry.metadata["reference"]
    assert mechanism_params(entry.obj) == {
        "d_state": 64, "init": "lin", "dt_min": 1e-3, "dt_max": 1e-1, "chunk_size": 64,
    }  # fmt: skip
    assert {build(d_state=6).state_size(n) for n in (1, 64, 1000)} == {D * 6}


# -- the published layer: S4D's block ----------------------------------------------------------

D_MODEL = 16


def build_layer(seed=0, **options) -> S4DLayer:
    torch.manual_seed(seed)
    layer = S4DLayer(D_MODEL, 4, **options).double()
    with torch.no_grad():
        layer.ssm.log_dt.copy_(torch.linspace(math.log(0.02), math.log(1.5), D_MODEL).view(1, -1))
    return layer


def test_the_layer_is_registered_and_takes_the_cores_options():
    assert layer_of(MECHANISMS.get("s4d")) is S4DLayer
    assert set(layer_params("layer s4d", S4DLayer)) == set(mechanism_params(S4D))


def test_the_layer_is_the_ssm_then_gelu_then_a_glu_output():
    """S4D's block (models/s4/s4d.py): y = K * x + D x per channel, GELU, a position-wise
    map to 2 d_model channels and a GLU (first half times the sigmoid of the second)."""
    layer = build_layer(chunk_size=5)
    x = torch.randn(2, 23, D_MODEL, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    ssm = pair_recurrence(x.unsqueeze(1), layer.ssm).squeeze(1)
    hidden = F.gelu(ssm) @ layer.output_linear.weight.T + layer.output_linear.bias
    first, second = hidden.split(D_MODEL, dim=-1)
    torch.testing.assert_close(layer(x), first * torch.sigmoid(second), **CLOSE)


@pytest.mark.parametrize("length", [1, 9, 40])
def test_the_layers_recurrent_form_equals_forward(length):
    layer = build_layer(chunk_size=8)
    x = torch.randn(2, length, D_MODEL, generator=torch.Generator().manual_seed(length),
                    dtype=torch.float64, requires_grad=True)  # fmt: skip
    out, stepped = layer(x), recurrent_layer_forward(layer, x)
    torch.testing.assert_close(stepped, out, **CLOSE)
    wrt = (x, *layer.parameters())
    grads = torch.autograd.grad(out.sum(), wrt)
    for got, want in zip(torch.autograd.grad(stepped.sum(), wrt), grads, strict=True):
        torch.testing.assert_close(got, want, **CLOSE)
    assert layer.state_size(length) == D_MODEL * 64
