"""deltanet's published layer (``DeltaNetLayer``, fla/layers/delta_net.py): the recurrent form
of the whole layer against the chunked ``forward`` in float64 under several option settings;
``forward`` against the parts written out here in fla's order; causality; the initial values
and shapes fla has; allow_neg_eigval (b in (0, 2)) in the core helpers; gradients; options;
torch.func vmap over stacked parameter copies; registration and state size."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from mechtools import CLOSE
from torch.func import functional_call, stack_module_state

from synthbench.core.layer import layer_of, layer_params, recurrent_layer_forward
from synthbench.core.mechanism import MECHANISMS
from synthbench.mechanisms.deltanet import (
    DeltaNetLayer,
    chunked_delta_rule,
    delta_rule_reference,
)

D_MODEL, HEADS = 16, 2  # head_dim 8


@pytest.fixture(autouse=True)
def _one_thread(single_thread):
    """The tensors here are tiny: one intra-op thread is faster on a shared machine."""


def build(seed=0, **options) -> DeltaNetLayer:
    """A float64 layer whose every parameter is non-trivial: the norm scales away from 1,
    b_proj larger so that b spans most of (0, 1) (or (0, 2)), conv biases non-zero."""
    torch.manual_seed(seed)
    layer = DeltaNetLayer(D_MODEL, HEADS, **options).double()
    with torch.no_grad():
        layer.o_norm.weight.copy_(0.5 + torch.rand(layer.o_norm.weight.shape))
        layer.b_proj.weight.mul_(4.0)
        for name, p in layer.named_parameters():
            if name.endswith("conv.bias"):
                p.copy_(torch.randn(p.shape) * 0.3)
    return layer


def sequence(length, seed=1, batch=2):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, length, D_MODEL, generator=g, dtype=torch.float64)


OPTIONS = [
    {},  # fla's defaults: conv 4, no gate, b in (0, 1)
    {"use_short_conv": False, "use_gate": True, "chunk_size": 4},
    {"allow_neg_eigval": True, "conv_bias": True, "conv_size": 2, "chunk_size": 5},
    {"use_gate": True, "allow_neg_eigval": True, "conv_size": 3, "chunk_size": 1},
]


@pytest.mark.parametrize("options", OPTIONS)
def test_recurrent_form_equals_forward(options):
    layer = build(**options)
    for length in (1, 7, 13, 70):  # none a multiple of 4, 5 or 64
        x = sequence(length, seed=length)
        y = layer(x)
        assert y.shape == x.shape
        torch.testing.assert_close(recurrent_layer_forward(layer, x), y, **CLOSE)


def rmsnorm(x, weight, eps):
    return x / torch.sqrt(x.square().mean(-1, keepdim=True) + eps) * weight


def written_out(layer: DeltaNetLayer, x: torch.Tensor, b_max: float) -> torch.Tensor:
    """fla's DeltaNet.forward, the parts written again here: projections, depthwise causal
    conv (kernel K, left-padded) + SiLU or SiLU alone, heads, b = b_max sigmoid(x W_b), the delta
    rule token by token, per-head RMSNorm (times silu(x W_g) with the gate), o_proj."""
    H, d = layer.n_heads, layer.head_dim

    def conv(module, t):
        w = module.conv.weight  # (channels, 1, K)
        out = F.conv1d(F.pad(t.mT, (w.shape[-1] - 1, 0)), w, module.conv.bias, groups=t.shape[-1])
        return F.silu(out.mT)

    q, k, v = layer.q_proj(x), layer.k_proj(x), layer.v_proj(x)
    if layer.use_short_conv:
        q, k, v = conv(layer.q_conv, q), conv(layer.k_conv, k), conv(layer.v_conv, v)
    else:
        q, k, v = F.silu(q), F.silu(k), F.silu(v)
    b = b_max * torch.sigmoid(layer.b_proj(x))  # (B, L, H)
    batch, length, _ = x.shape
    o = torch.zeros(batch, length, H, d, dtype=x.dtype)
    for i in range(batch):
        for h in range(H):
            S = torch.zeros(d, d, dtype=x.dtype)
            for t in range(length):
                qt, kt, vt = (z[i, t, h * d : (h + 1) * d] for z in (q, k, v))
                kt = kt / torch.sqrt(kt @ kt + 1e-6)
                qt = qt / torch.sqrt(qt @ qt + 1e-6) / math.sqrt(d)
                S = S + b[i, t, h] * torch.outer(kt, vt - S.mT @ kt)
                o[i, t, h] = S.mT @ qt
    o = rmsnorm(o, layer.o_norm.weight, layer.o_norm.eps)
    if layer.use_gate:
        o = o * F.silu(layer.g_proj(x).unflatten(-1, (H, d)))
    return layer.o_proj(o.flatten(-2))


@pytest.mark.parametrize("options", OPTIONS[:3])
def test_forward_is_the_published_order_of_parts(options):
    layer = build(seed=2, **options)
    x = sequence(9, seed=3)
    b_max = 2.0 if options.get("allow_neg_eigval") else 1.0
    torch.testing.assert_close(layer(x), written_out(layer, x, b_max), **CLOSE)


@pytest.mark.parametrize("options", OPTIONS[:3])
def test_causal(options):
    layer = build(seed=4, **options)
    x = sequence(20, seed=5)
    y = layer(x)
    for t in (0, 6, 19):
        x2 = x.clone()
        x2[:, t] += torch.randn(x.shape[0], D_MODEL, dtype=x.dtype)
        y2 = layer(x2)
        torch.testing.assert_close(y2[:, :t], y[:, :t], **CLOSE)
        assert (y2[:, t] - y[:, t]).abs().max() > 1e-6
    with pytest.raises(ValueError, match="causal only"):
        layer(x, causal=False)


def test_initial_values_and_shapes_are_fla_s():
    """fla/layers/delta_net.py at its defaults: no biases anywhere, one b per head, depthwise
    kernel-4 convolutions on q, k and v, a per-head RMSNorm with ones, no gate projection."""
    layer = DeltaNetLayer(64, 4)
    assert layer.head_dim == 16 and layer.beta_max == 1.0 and not layer.use_gate
    for proj in (layer.q_proj, layer.k_proj, layer.v_proj, layer.o_proj):
        assert proj.weight.shape == (64, 64) and proj.bias is None
    assert layer.b_proj.weight.shape == (4, 64) and layer.b_proj.bias is None
    for conv in (layer.q_conv, layer.k_conv, layer.v_conv):
        assert conv.conv.weight.shape == (64, 1, 4) and conv.conv.bias is None and conv.activation
    assert torch.equal(layer.o_norm.weight, torch.ones(16)) and layer.o_norm.eps == 1e-5
    assert not hasattr(layer, "g_proj")
    gated = DeltaNetLayer(64, 4, use_gate=True, allow_neg_eigval=True)
    assert gated.g_proj.weight.shape == (64, 64) and gated.g_proj.bias is None
    assert gated.o_norm.norm_before_gate and torch.equal(gated.o_norm.weight, torch.ones(16))
    assert gated.beta_max == 2.0
    assert not hasattr(DeltaNetLayer(64, 4, use_short_conv=False), "q_conv")


def test_negative_eigenvalues_double_b_in_the_core_helpers():
    """beta_max 2: the chunked form still equals the recurrence, and at length 1
    o = 2 sigmoid(beta) (q^ . k^) v; the default (1) is the core's sigmoid unchanged."""
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(2, 2, 11, 8, generator=g, dtype=torch.float64) for _ in range(3))
    beta = torch.randn(2, 2, 11, 1, generator=g, dtype=torch.float64) * 3
    torch.testing.assert_close(
        chunked_delta_rule(q, k, v, beta, 4, beta_max=2.0),
        delta_rule_reference(q, k, v, beta, beta_max=2.0),
        **CLOSE,
    )
    assert torch.equal(chunked_delta_rule(q, k, v, beta, 4, beta_max=1.0),
                       chunked_delta_rule(q, k, v, beta, 4))  # fmt: skip
    q1, k1, v1, b1 = (t[:, :, :1] for t in (q, k, v, beta))
    qn = q1 / (q1.square().sum(-1, keepdim=True) + 1e-6).sqrt() / math.sqrt(8)
    kn = k1 / (k1.square().sum(-1, keepdim=True) + 1e-6).sqrt()
    expected = 2 * torch.sigmoid(b1) * (qn * kn).sum(-1, keepdim=True) * v1
    torch.testing.assert_close(chunked_delta_rule(q1, k1, v1, b1, beta_max=2.0), expected, **CLOSE)


@pytest.mark.parametrize("options", [{}, {"use_gate": True, "conv_bias": True}])
def test_backward_reaches_every_parameter(options):
    layer = build(seed=7, **options).float()
    x = sequence(37, seed=8).float()
    params = dict(layer.named_parameters())
    grads = torch.autograd.grad(layer(x).square().sum(), list(params.values()))
    for name, grad in zip(params, grads, strict=True):
        assert bool(grad.isfinite().all()), name
        assert grad.abs().sum() > 0, name


def test_options_are_checked():
    assert layer_params("deltanet", DeltaNetLayer) == {
        "conv_size": 4, "use_short_conv": True, "conv_bias": False, "use_gate": False,
        "allow_neg_eigval": False, "norm_eps": 1e-5, "chunk_size": 64,
    }  # fmt: skip
    with pytest.raises(ValueError, match="no parameter conv_sise.*conv_size"):
        layer_params("deltanet", DeltaNetLayer, {"conv_sise": 3})
    with pytest.raises(ValueError, match="use_gate must be bool"):
        layer_params("deltanet", DeltaNetLayer, {"use_gate": 1})
    bad = [
        ({"conv_size": 0}, "conv_size"),
        ({"chunk_size": -2}, "chunk_size"),
        ({"norm_eps": 0.0}, "norm_eps"),
        ({"use_gate": "yes"}, "use_gate"),
        ({"allow_neg_eigval": 2}, "allow_neg_eigval"),
    ]
    for options, name in bad:
        with pytest.raises(ValueError, match=name) as info:
            DeltaNetLayer(D_MODEL, HEADS, **options)
        assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="must divide d_model"):
        DeltaNetLayer(10, 3)


def test_vmap_over_stacked_parameter_copies():
    """Packed training: functional_call vmapped over 2 copies gives each copy's own output."""
    copies = [build(seed=s, use_gate=True).float() for s in (10, 11)]
    params, buffers = stack_module_state(copies)
    x = sequence(21, seed=12).float()

    def run(p, b):
        return functional_call(copies[0], (p, b), (x,))

    out = torch.func.vmap(run)(params, buffers)
    for i, layer in enumerate(copies):
        torch.testing.assert_close(out[i], layer(x), atol=1e-5, rtol=1e-5)


def test_registered_on_the_mechanism_and_state_size():
    assert layer_of(MECHANISMS.get("deltanet")) is DeltaNetLayer
    layer = DeltaNetLayer(64, 4)
    # three windows of 3 positions x 64 channels, and a 16 x 16 S per head, whatever L
    assert {layer.state_size(n) for n in (1, 256)} == {3 * 3 * 64 + 4 * 16 * 16}
    assert DeltaNetLayer(64, 4, use_short_conv=False).state_size(9) == 4 * 16 * 16
    state = layer.initial_state(2, "cpu", torch.float32)
    numbers = sum(t[0].numel() for t in state)
    assert numbers == layer.state_size(1)
