"""gla: the chunkwise form of ``forward`` (``chunked_gla``) against the token-by-token
recurrence ``gla_reference`` in float64, forward and backward (q, k, v and the gate), at
lengths that do and do not divide the chunk, with mild and strong decays and several sub-chunk
sizes; the reference against a loop written here from the docstring's unrolled formula
(alpha = sigmoid(gate)^(1/16) computed directly); the scale, the gate on the key dimension; the
recurrent form at other chunk sizes; the layer's gate projection; long sequences, dtypes,
large inputs, causal only, parameters, state."""

from __future__ import annotations

import math

import pytest
import torch
from mechtools import CLOSE, LargestTensor, assert_same_function, lengths_around

from synthbench.core.mechanism import MECHANISMS, mechanism_params, recurrent_forward
from synthbench.core.model import MultiHeadAttention
from synthbench.mechanisms.gla import chunked_gla, gla_reference

B, H, D = 2, 3, 8


@pytest.fixture(autouse=True)
def _one_thread(single_thread):
    """The tensors here are tiny: one intra-op thread is faster on a shared machine."""


def inputs(length, seed=0, dtype=torch.float64, requires_grad=False, scale=1.0, heads=H):
    """q, k, v and gate, each (B, heads, length, D), standard normal times ``scale``."""
    g = torch.Generator().manual_seed(seed)
    return tuple(
        (torch.randn(B, heads, length, D, generator=g, dtype=dtype) * scale).requires_grad_(
            requires_grad
        )
        for _ in range(4)
    )


def build(heads=H, **params):
    return MECHANISMS.get("gla")(D, heads, **params)


INPUTS = ("q", "k", "v", "gate")  # what the tests differentiate


def call(mechanism):
    return lambda q, k, v, gate: mechanism(q, k, v, gate=gate)


def loop_reference(q, k, v, gate, tau=16.0):
    """The docstring's unrolled formula, term by term, with alpha = sigmoid(gate)^(1/tau):
    o_t = sum_{s <= t} sum_m (q_t[m] / sqrt(d)) k_s[m] (prod_{s < r <= t} alpha_r[m]) v_s."""
    alpha = torch.sigmoid(gate) ** (1 / tau)
    out = torch.zeros_like(v)
    for t in range(q.shape[-2]):
        decay = torch.ones_like(alpha[:, :, 0])  # prod_{s < r <= t} alpha_r, for s = t
        for s in range(t, -1, -1):
            score = (q[:, :, t] / math.sqrt(D) * k[:, :, s] * decay).sum(-1, keepdim=True)
            out[:, :, t] += score * v[:, :, s]
            decay = decay * alpha[:, :, s]
    return out


@pytest.mark.parametrize(
    ("chunk", "subchunk"), [(64, 16), (16, 16), (5, 16), (40, 16), (16, 3), (7, 3)]
)
def test_chunkwise_form_equals_the_recurrence(chunk, subchunk):
    """chunk 40 with sub-chunks of 16 pads each chunk to 48; (7, 3) to 9."""
    for length in lengths_around(chunk):
        args = inputs(length, seed=length, requires_grad=True)
        assert_same_function(
            lambda q, k, v, gate: chunked_gla(q, k, v, gate, 16.0, chunk, subchunk),
            gla_reference,
            args,
            names=INPUTS,
        )


@pytest.mark.parametrize("chunk", [64, 16, 5])
def test_forward_equals_the_recurrence(chunk):
    mechanism = build(chunk_size=chunk)
    for length in lengths_around(chunk):
        assert_same_function(
            call(mechanism),
            gla_reference,
            inputs(length, seed=length + 1, requires_grad=True),
            names=INPUTS,
        )


@pytest.mark.parametrize("tau", [1.0, 0.25])
def test_strong_decays(tau):
    """With tau 1 or 1/4 and gates x4, many decays underflow to 0 within a chunk: the masked
    log-space differences keep every gradient exact and finite."""
    mechanism = build(chunk_size=16, gate_temperature=tau)
    q, k, v, gate = inputs(45, seed=2)
    args = (q, k, v, (4 * gate).detach().requires_grad_())
    for t in (q, k, v):
        t.requires_grad_()
    assert_same_function(
        call(mechanism), lambda q, k, v, gate: gla_reference(q, k, v, gate, tau), args, names=INPUTS
    )


def test_both_forms_are_the_docstring_formula():
    q, k, v, gate = inputs(19, seed=3)
    gate = 3 * gate  # decays from about 0.6 to 1 per step
    expected = loop_reference(q, k, v, gate)
    torch.testing.assert_close(gla_reference(q, k, v, gate), expected, **CLOSE)
    torch.testing.assert_close(build(chunk_size=4)(q, k, v, gate=gate), expected, **CLOSE)
    expected = loop_reference(q, k, v, gate, tau=2.0)
    torch.testing.assert_close(
        build(chunk_size=4, gate_temperature=2)(q, k, v, gate=gate), expected, **CLOSE
    )


def test_q_is_scaled_by_the_inverse_square_root_of_head_dim():
    """At length 1 the gate decays nothing: o_0 = (q_0 . k_0 / sqrt(d)) v_0."""
    q, k, v, gate = inputs(1, seed=4)
    expected = (q * k).sum(-1, keepdim=True) / math.sqrt(D) * v
    torch.testing.assert_close(build()(q, k, v, gate=gate), expected, **CLOSE)


def test_the_gate_decays_the_key_dimension():
    """A gate of -1e4 on key coordinate 0 at position 1 (alpha about e^-625) erases what
    position 0 wrote along k[0] and nothing else: o_1 = (q_1 / sqrt(d)) (k_0' ^T v_0 +
    k_1^T v_1), k_0' = k_0 with coordinate 0 set to 0."""
    q, k, v, _ = inputs(2, seed=5)
    gate = torch.full_like(q, 1e4)  # alpha = sigmoid(1e4)^(1/16) = 1 elsewhere
    gate[:, :, 1, 0] = -1e4
    kept = k[:, :, 0].clone()
    kept[..., 0] = 0
    state = kept.unsqueeze(-1) * v[:, :, 0].unsqueeze(-2)
    state = state + k[:, :, 1].unsqueeze(-1) * v[:, :, 1].unsqueeze(-2)
    expected = (q[:, :, 1].unsqueeze(-2) / math.sqrt(D) @ state).squeeze(-2)
    for chunk in (1, 2):
        out = build(chunk_size=chunk)(q, k, v, gate=gate)
        torch.testing.assert_close(out[:, :, 1], expected, **CLOSE)


@pytest.mark.parametrize("chunk", [1, 3, 16])
def test_recurrent_form_at_other_chunk_sizes(chunk):
    mechanism = build(chunk_size=chunk).to(torch.float64)
    args = inputs(21, seed=6, requires_grad=True)
    assert_same_function(
        lambda q, k, v, gate: recurrent_forward(mechanism, q, k, v, gate=gate),
        call(mechanism),
        args,
        names=INPUTS,
    )


def test_the_layer_projects_a_gate_per_head_and_key_coordinate():
    torch.manual_seed(0)
    layer = MultiHeadAttention(16, 2, MECHANISMS.get("gla")(8, 2))
    assert layer.extra_widths == {"gate": 8} and layer.extra.out_features == 2 * 8
    x = torch.randn(3, 70, 16)
    y = layer(x)
    assert y.shape == x.shape
    assert torch.autograd.grad(y.sum(), layer.extra.weight)[0].abs().sum() > 0


def test_long_sequences_in_float32_match_the_float64_recurrence():
    """Far beyond the suite's longest length, and with one chunk of 1000: only decays <= 1
    are ever exponentiated, nothing overflows."""
    reference = build(heads=2).to(torch.float64)
    for length, chunk in [(544, 64), (3000, 64), (3000, 1000)]:
        mechanism = build(heads=2, chunk_size=chunk)
        args = inputs(length, seed=7, dtype=torch.float32, heads=2)
        out = mechanism(*args[:3], gate=args[3])
        assert out.dtype == torch.float32 and bool(out.isfinite().all())
        q, k, v, gate = (t.double() for t in args)
        expected = recurrent_forward(reference, q, k, v, gate=gate)
        torch.testing.assert_close(out.double(), expected, atol=1e-4, rtol=1e-4)


def test_no_length_by_length_matrix_nor_a_chunk_by_chunk_by_key_tensor():
    length = 512
    q, k, v, gate = inputs(length, seed=8, dtype=torch.float32)
    with LargestTensor() as seen:
        build(chunk_size=64)(q, k, v, gate=gate)
    # at most the in-chunk scores, each query against its chunk of 64 keys; not the
    # (query, key, key coordinate) decays of a chunk, 64 x D per position
    assert seen.largest <= B * H * length * 64 < B * H * length * 64 * D


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_dtypes(dtype):
    mechanism = build(chunk_size=16)
    q, k, v, gate = (t.to(dtype) for t in inputs(45, seed=9, dtype=torch.float32))
    out = mechanism(q, k, v, gate=gate)
    assert out.dtype == dtype and out.shape == v.shape and bool(out.isfinite().all())
    expected = mechanism(q.double(), k.double(), v.double(), gate=gate.double())
    tol = {"atol": 2e-2, "rtol": 1e-2} if dtype == torch.bfloat16 else {"atol": 1e-5, "rtol": 1e-5}
    torch.testing.assert_close(out.double(), expected, **tol)


@pytest.mark.parametrize("tau", [16.0, 1.0])
def test_inputs_times_a_hundred_stay_finite(tau):
    args = inputs(544, seed=10, dtype=torch.float32, requires_grad=True, scale=100.0)
    out = build(gate_temperature=tau)(*args[:3], gate=args[3])
    grads = torch.autograd.grad(out.sum(), args)
    assert bool(out.isfinite().all()) and all(bool(g.isfinite().all()) for g in grads)


def test_causal_only_and_gate_required():
    q, k, v, gate = inputs(5)
    with pytest.raises(ValueError, match="gla is causal only"):
        build()(q, k, v, causal=False, gate=gate)
    with pytest.raises(ValueError, match="extra input gate"):
        build()(q, k, v)


@pytest.mark.parametrize(
    "params",
    [
        {"chunk_size": 0},
        {"chunk_size": -1},
        {"chunk_size": 2.0},
        {"gate_temperature": 0},
        {"gate_temperature": -1.0},
        {"gate_temperature": math.inf},
        {"gate_temperature": math.nan},
        {"gate_temperature": True},
    ],
)
def test_invalid_parameters_are_refused(params):
    with pytest.raises(ValueError, match=next(iter(params))):
        build(**params)


def test_registration_and_state_size():
    entry = MECHANISMS.entry("gla")
    assert MECHANISMS.get("gated-linear-attention") is entry.obj
    assert entry.metadata["complexity"] == "linear"
    assert entry.metadata["family"] == "gated-linear"
    assert mechanism_params(entry.obj) == {"chunk_size": 64, "gate_temperature": 16.0}
    mechanism = build()
    assert mechanism.extra_inputs == {"gate": D}
    assert not list(mechanism.parameters()) and not list(mechanism.buffers())
    assert {mechanism.state_size(n) for n in (1, 64, 1000)} == {D * D}
