"""gated-deltanet: the chunkwise (WY / UT transform with decay) form against the token-by-token
recurrence ``gated_delta_rule_reference`` in float64, forward and backward (q, k, v, beta,
gate and the parameters A_log, dt_bias), at lengths that do and do not divide the chunk; the
reference against a loop written here from the docstring; alpha = 1 is deltanet; the step
form; causal only, registration, initial values. Then the published layer
``GatedDeltaNetLayer``: its recurrent form equals its parallel form in float64 under several
options, causality, fla's initial values and sizes, gradients, options, torch.func vmap."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from mechtools import CLOSE, assert_same_function, lengths_around

from synthbench.core.layer import layer_of, layer_params, recurrent_layer_forward
from synthbench.core.mechanism import MECHANISMS, mechanism_params, recurrent_forward
from synthbench.core.model import MultiHeadAttention
from synthbench.mechanisms.deltanet import chunked_delta_rule
from synthbench.mechanisms.gated_deltanet import (
    GatedDeltaNet,
    GatedDeltaNetLayer,
    chunked_gated_delta_rule,
    gated_delta_rule_reference,
    log_decay,
)

B, H, D = 2, 3, 8


@pytest.fixture(autouse=True)
def _one_thread(single_thread):
    """The tensors here are tiny: one intra-op thread is faster on a shared machine."""


def inputs(length, seed=0, dtype=torch.float64, requires_grad=False, scale=1.0, dim_v=D):
    """q, k (B, H, length, D), v (B, H, length, dim_v), beta and gate (B, H, length, 1):
    standard normal, the gate times 3 so that the decays spread over (0, 1)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for width, factor in ((D, 1), (D, 1), (dim_v, 1), (1, 1), (1, 3)):
        t = torch.randn(B, H, length, width, generator=g, dtype=dtype) * scale * factor
        out.append(t.requires_grad_(requires_grad))
    return tuple(out)


INPUTS = ("q", "k", "v", "beta", "gate", "A_log", "dt_bias")  # what the tests differentiate


def build(heads=H, seed=0, **params):
    """The core in float64, its A_log and dt_bias moved off their initial values a little."""
    torch.manual_seed(seed)
    mechanism = MECHANISMS.get("gated-deltanet")(D, heads, **params).to(torch.float64)
    with torch.no_grad():
        mechanism.dt_bias.add_(2.0)  # larger steps: decays well below 1
    return mechanism


def call(mechanism):
    return lambda q, k, v, beta, gate: mechanism(q, k, v, beta=beta, gate=gate)


def reference(mechanism):
    def run(q, k, v, beta, gate):
        log_alpha = log_decay(gate, mechanism.A_log, mechanism.dt_bias)
        return gated_delta_rule_reference(q, k, v, beta, log_alpha)

    return run


@pytest.mark.parametrize("chunk", [64, 16, 5, 1])
def test_chunkwise_form_equals_the_recurrence(chunk):
    mechanism = build(chunk_size=chunk)
    params = (mechanism.A_log, mechanism.dt_bias)
    for length in lengths_around(chunk):
        args = inputs(length, seed=length, requires_grad=True)
        assert_same_function(call(mechanism), reference(mechanism), args, names=INPUTS,
                             params=params)  # fmt: skip


@pytest.mark.parametrize("chunk", [4, 7])
def test_chunkwise_form_with_wider_values(chunk):
    """d_v != d (the layer's value heads are wider than its key heads)."""
    q, k, v, beta, gate = inputs(2 * chunk + 3, seed=11, requires_grad=True, dim_v=13)
    log_alpha = (-F.softplus(gate[..., 0])).detach().requires_grad_(True)
    args = (q, k, v, beta, log_alpha)
    assert_same_function(
        lambda *a: chunked_gated_delta_rule(*a, chunk_size=chunk),
        gated_delta_rule_reference,
        args,
        names=("q", "k", "v", "beta", "log_alpha"),
    )


def loop_reference(q, k, v, beta, log_alpha):
    """The docstring, written again: k^ = k / sqrt(|k|^2 + 1e-6), q^ likewise times d^-1/2,
    b = 1 / (1 + e^-beta), S_t = alpha_t (I - b k^ k^^T) S_{t-1} + b k^ v^T, o_t = S_t^T q^."""
    batch, heads, length, dim = q.shape
    out = torch.zeros_like(v)
    for x in range(batch):
        for h in range(heads):
            S = torch.zeros(dim, v.shape[-1], dtype=q.dtype)
            for t in range(length):
                kt = k[x, h, t] / math.sqrt(float(k[x, h, t] @ k[x, h, t]) + 1e-6)
                qt = q[x, h, t] / math.sqrt(float(q[x, h, t] @ q[x, h, t]) + 1e-6) / math.sqrt(dim)
                b = 1 / (1 + math.exp(-float(beta[x, h, t, 0])))
                alpha = math.exp(float(log_alpha[x, h, t]))
                S = alpha * (torch.eye(dim, dtype=q.dtype) - b * torch.outer(kt, kt)) @ S
                S = S + b * torch.outer(kt, v[x, h, t])
                out[x, h, t] = S.mT @ qt
    return out


def test_both_forms_are_the_docstring_formula():
    mechanism = build(chunk_size=6)
    q, k, v, beta, gate = inputs(19, seed=3)
    with torch.no_grad():
        A, dt = mechanism.A_log.exp(), F.softplus(gate[..., 0] + mechanism.dt_bias.view(-1, 1))
        log_alpha = -A.view(-1, 1) * dt  # l = -exp(A_log) softplus(gate + dt_bias)
        expected = loop_reference(q, k, v, beta, log_alpha)
        assert float(log_alpha.min()) < -1 and float(log_alpha.max()) < 0  # real decays
        torch.testing.assert_close(gated_delta_rule_reference(q, k, v, beta, log_alpha),
                                   expected, **CLOSE)  # fmt: skip
        torch.testing.assert_close(chunked_gated_delta_rule(q, k, v, beta, log_alpha, 4),
                                   expected, **CLOSE)  # fmt: skip
        torch.testing.assert_close(mechanism(q, k, v, beta=beta, gate=gate), expected, **CLOSE)


@pytest.mark.parametrize("chunk", [1, 5, 64])
def test_alpha_one_is_deltanet(chunk):
    q, k, v, beta, gate = inputs(23, seed=4)
    zero = torch.zeros(B, H, 23, dtype=torch.float64)
    expected = chunked_delta_rule(q, k, v, beta, chunk_size=chunk)
    torch.testing.assert_close(chunked_gated_delta_rule(q, k, v, beta, zero, chunk), expected,
                               **CLOSE)  # fmt: skip
    torch.testing.assert_close(gated_delta_rule_reference(q, k, v, beta, zero), expected, **CLOSE)
    # the core with A = exp(A_log) = 0: no decay
    mechanism = build(chunk_size=chunk)
    with torch.no_grad():
        mechanism.A_log.fill_(-1e4)
    torch.testing.assert_close(mechanism(q, k, v, beta=beta, gate=gate), expected, **CLOSE)


@pytest.mark.parametrize("chunk", [1, 3, 16])
def test_step_form_equals_the_recurrence(chunk):
    mechanism = build(chunk_size=chunk)
    args = inputs(21, seed=5, requires_grad=True)
    assert_same_function(
        lambda q, k, v, beta, gate: recurrent_forward(mechanism, q, k, v, beta=beta, gate=gate),
        reference(mechanism),
        args,
        names=INPUTS,
        params=(mechanism.A_log, mechanism.dt_bias),
    )


def test_float32_long_sequence_and_large_inputs():
    mechanism64 = build()
    mechanism32 = build().float()
    q, k, v, beta, gate = inputs(300, seed=6, dtype=torch.float32)
    out = mechanism32(q, k, v, beta=beta, gate=gate)
    assert out.dtype == torch.float32 and bool(out.isfinite().all())
    expected = mechanism64(*(x.double() for x in (q, k, v)), beta=beta.double(),
                           gate=gate.double())  # fmt: skip
    torch.testing.assert_close(out.double(), expected, atol=1e-4, rtol=1e-4)
    args = inputs(200, seed=7, dtype=torch.float32, requires_grad=True, scale=100.0)
    out = mechanism32(*args[:3], beta=args[3], gate=args[4])
    grads = torch.autograd.grad(out.square().sum(), args)
    assert bool(out.isfinite().all()) and all(bool(g.isfinite().all()) for g in grads)


def test_causal_only_and_extra_inputs_required():
    assert GatedDeltaNet.causal_only
    q, k, v, beta, gate = inputs(5)
    with pytest.raises(ValueError, match="gated-deltanet is causal only"):
        build()(q, k, v, causal=False, beta=beta, gate=gate)
    with pytest.raises(ValueError, match="beta and gate"):
        build()(q, k, v, beta=beta)


def test_registration_parameters_and_state_size():
    entry = MECHANISMS.entry("gated-deltanet")
    assert entry.obj is GatedDeltaNet and MECHANISMS.get("gated-delta-net") is GatedDeltaNet
    assert entry.metadata["complexity"] == "linear"
    assert entry.metadata["family"] == "delta-rule"
    assert "2412.06464" in entry.metadata["reference"]
    assert mechanism_params(GatedDeltaNet) == {"chunk_size": 64}
    mechanism = GatedDeltaNet(D, H)
    assert mechanism.extra_inputs == {"beta": 1, "gate": 1}
    assert {name for name, _ in mechanism.named_parameters()} == {"A_log", "dt_bias"}
    assert mechanism.A_log._no_weight_decay and mechanism.dt_bias._no_weight_decay
    assert {mechanism.state_size(n) for n in (1, 64, 1000)} == {D * D}
    with pytest.raises(ValueError, match="chunk_size"):
        GatedDeltaNet(D, H, chunk_size=0)


def test_the_core_track_projects_beta_and_gate():
    torch.manual_seed(0)
    attention = MultiHeadAttention(16, 2, GatedDeltaNet(8, 2))
    assert attention.extra.out_features == 4  # beta and gate per head
    x = torch.randn(3, 20, 16)
    y = attention(x)
    assert y.shape == x.shape
    assert torch.autograd.grad(y.sum(), attention.extra.weight)[0].abs().sum() > 0


def assert_initial_values(A_log, dt_bias):
    """fla's Gated DeltaNet init: A = exp(A_log) in (0, 16), softplus(dt_bias) in [1e-3, 1e-1]."""
    A_log, dt_bias = A_log.detach(), dt_bias.detach()
    A, dt = A_log.exp(), F.softplus(dt_bias.double())
    assert A_log.dtype == dt_bias.dtype == torch.float32
    assert float(A.min()) > 0 and float(A.max()) <= 16
    assert float(dt.min()) >= 1e-3 - 1e-9 and float(dt.max()) <= 1e-1 + 1e-9
    if len(A) >= 500:  # spread over the whole ranges: uniform A, log-uniform dt
        assert float(A.min()) < 0.5 and float(A.max()) > 15.5
        assert abs(float(A.mean()) - 8) < 1
        assert abs(float(dt.log().mean()) - math.log(1e-2)) < 0.3


def test_initial_values_are_fla_s():
    torch.manual_seed(1)
    core = GatedDeltaNet(4, 1000)
    assert_initial_values(core.A_log, core.dt_bias)
    layer = GatedDeltaNetLayer(64, 1000, head_dim=1)
    assert_initial_values(layer.A_log, layer.dt_bias)
    assert layer.A_log._no_weight_decay and layer.dt_bias._no_weight_decay


# ---- the published layer -------------------------------------------------------------------


def make_layer(seed=0, d_model=32, n_heads=4, **options):
    """A float64 layer whose gates, biases and norm weights are moved off their initial
    values, so that no part is degenerate (decays well below 1, non-unit norm weights)."""
    torch.manual_seed(seed)
    layer = GatedDeltaNetLayer(d_model, n_heads, **options).double()
    with torch.no_grad():
        layer.dt_bias.add_(2.0)
        layer.A_log.copy_(torch.rand(n_heads, dtype=torch.float64).mul(3).sub(1))
        layer.o_norm.weight.copy_(1 + 0.5 * torch.randn_like(layer.o_norm.weight))
    return layer


OPTIONS = [
    {},
    {"chunk_size": 5},
    {"use_short_conv": False, "chunk_size": 8},
    {"use_gate": False, "conv_size": 3, "chunk_size": 4},
    {"head_dim": 4, "expand_v": 1.5, "chunk_size": 16},
]


@pytest.mark.parametrize("options", OPTIONS)
def test_layer_recurrent_form_equals_the_parallel_form(options):
    layer = make_layer(**options)
    for length in (1, 7, 37):
        x = torch.randn(
            2, length, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(length)
        )
        expected = layer(x)
        assert expected.shape == x.shape
        torch.testing.assert_close(recurrent_layer_forward(layer, x), expected, atol=1e-10,
                                   rtol=1e-9)  # fmt: skip


@torch.no_grad()
def test_layer_is_causal():
    layer = make_layer(chunk_size=5)
    x = torch.randn(2, 23, 32, dtype=torch.float64)
    base = layer(x)
    for t in (0, 6, 11, 22):
        changed = x.clone()
        changed[:, t] += torch.randn(2, 32, dtype=torch.float64)
        out = layer(changed)
        torch.testing.assert_close(out[:, :t], base[:, :t], atol=1e-12, rtol=0)
        assert float((out[:, t] - base[:, t]).abs().max()) > 1e-6
    with pytest.raises(ValueError, match="causal only"):
        layer(x, causal=False)


def test_layer_sizes_follow_fla_s_ratios():
    """d_model 64, 4 heads: key heads 0.75 * 64 / 4 = 12, value heads 24, about 6 d_model^2
    parameters (fla's docstring); the state: three conv windows and S per head."""
    layer = GatedDeltaNetLayer(64, 4)
    assert (layer.head_dim, layer.head_v_dim) == (12, 24)
    assert (layer.key_dim, layer.value_dim) == (48, 96)
    projections = sum(p.numel() for n, p in layer.named_parameters() if n.endswith("proj.weight"))
    assert projections == 6 * 64 * 64 + 2 * 4 * 64  # + a_proj and b_proj
    assert layer.state_size(100) == 3 * (48 + 48 + 96) + 4 * 12 * 24
    assert GatedDeltaNetLayer(64, 4, use_short_conv=False).state_size(100) == 4 * 12 * 24
    assert layer.q_conv.kernel == 4 and layer.o_norm.norm_before_gate
    assert layer.o_norm.eps == 1e-5
    assert layer_of(GatedDeltaNet) is GatedDeltaNetLayer
    assert layer_params("gated-deltanet", GatedDeltaNetLayer) == {
        "head_dim": 0,
        "expand_v": 2.0,
        "use_short_conv": True,
        "conv_size": 4,
        "use_gate": True,
        "norm_eps": 1e-5,
        "chunk_size": 64,
    }


@pytest.mark.parametrize("options", [{}, {"use_gate": False, "use_short_conv": False}])
def test_layer_gradients_reach_every_parameter(options):
    layer = make_layer(**options)
    x = torch.randn(2, 19, 32, dtype=torch.float64, requires_grad=True)
    names, params = zip(*layer.named_parameters(), strict=True)
    grads = torch.autograd.grad(layer(x).square().sum(), (x, *params))
    for name, grad in zip(("x", *names), grads, strict=True):
        assert bool(grad.isfinite().all()), name
        assert float(grad.abs().sum()) > 0, name


def test_layer_options_are_checked():
    with pytest.raises(ValueError, match="conv_size"):  # the close match is named
        layer_params("gated-deltanet", GatedDeltaNetLayer, {"conv_sise": 3})
    with pytest.raises(ValueError, match="use_gate must be bool"):
        layer_params("gated-deltanet", GatedDeltaNetLayer, {"use_gate": 1})
    bad = [
        ({"conv_size": 0}, "conv_size"),
        ({"chunk_size": 0}, "chunk_size"),
        ({"expand_v": -1.0}, "expand_v"),
        ({"expand_v": 1.3}, "expand_v"),
        ({"norm_eps": 0.0}, "norm_eps"),
        ({"head_dim": -2}, "head_dim"),
    ]
    for options, match in bad:
        with pytest.raises(ValueError, match=match) as caught:
            GatedDeltaNetLayer(64, 4, **options)
        assert "\n" not in str(caught.value)
    with pytest.raises(ValueError, match="head_dim"):
        GatedDeltaNetLayer(10, 4)  # 0.75 * 10 / 4 is not whole


def test_layer_under_torch_func_vmap():
    """Packed training: vmap of functional_call over 2 stacked parameter copies gives each
    copy its own output."""
    copies = [make_layer(seed=s, chunk_size=8) for s in (1, 2)]
    params, buffers = torch.func.stack_module_state(copies)
    x = torch.randn(2, 13, 32, dtype=torch.float64)

    def run(p, b):
        return torch.func.functional_call(copies[0], (p, b), (x,))

    out = torch.func.vmap(run)(params, buffers)
    for i, layer in enumerate(copies):
        torch.testing.assert_close(out[i], layer(x), atol=1e-10, rtol=1e-9)
