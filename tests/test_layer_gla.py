"""GLALayer, the published GLA layer (mechanisms/gla.py, "The published layer"): the
parallel forward (``chunked_gla``) against the token-by-token ``step`` in float64 with and
without the short convolution and the output gate; against the layer written out here from
fla/layers/gla.py's order of operations on the core's reference recurrence; causality; the
published sizes and initial values; gradients; options; a torch.func vmap over stacked copies."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call, stack_module_state

from synthbench.core.layer import (
    GatedRMSNorm,
    RMSNorm,
    layer_of,
    layer_params,
    recurrent_layer_forward,
)
from synthbench.core.mechanism import MECHANISMS
from synthbench.mechanisms.gla import GatedLinearAttention, GLALayer, gla_reference

D_MODEL, HEADS, B = 64, 4, 2


@pytest.fixture(autouse=True)
def _one_thread(single_thread):
    """The tensors here are tiny: one intra-op thread is faster on a shared machine."""


def build(seed=0, dtype=torch.float64, **options):
    """A layer with every parameter moved off its initial value: norm weights away from 1
    and gate biases spread, so that decays range from mild to strong."""
    torch.manual_seed(seed)
    layer = GLALayer(D_MODEL, HEADS, **options).to(dtype)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if name == "gk_proj.1.bias":
                p.copy_(torch.linspace(-6.0, 3.0, p.numel(), dtype=dtype))
            elif name == "norm.weight":
                p.copy_(0.5 + torch.rand_like(p))
            else:
                p.mul_(1.5)
    return layer


def sequence(length, seed=1, dtype=torch.float64):
    return torch.randn(B, length, D_MODEL, generator=torch.Generator().manual_seed(seed)).to(dtype)


SETTINGS = [
    dict(chunk_size=16),  # the published defaults otherwise: no conv, with the output gate
    dict(chunk_size=16, use_short_conv=True, gate_logit_normalizer=1.0),
    dict(chunk_size=64, use_short_conv=True, conv_size=3, use_output_gate=False),
    dict(chunk_size=8, expand_k=1.0, expand_v=0.5, gate_low_rank_dim=4),
]


@pytest.mark.parametrize("options", SETTINGS)
@pytest.mark.parametrize("length", [1, 45, 70])
def test_recurrent_form_equals_forward(options, length):
    layer = build(**options)
    x = sequence(length)
    parallel = layer(x)
    recurrent = recurrent_layer_forward(layer, x)
    assert parallel.shape == (B, length, D_MODEL)
    torch.testing.assert_close(parallel, recurrent, rtol=1e-10, atol=1e-10)


def written_out(layer: GLALayer, x: torch.Tensor) -> torch.Tensor:
    """fla/layers/gla.py's forward, step by step, on the core's token-by-token reference."""
    q, k, v = layer.q_proj(x), layer.k_proj(x), layer.v_proj(x)
    if layer.use_short_conv:
        q, k, v = layer.q_conv(q), layer.k_conv(k), layer.v_conv(v)
    low_rank, full = layer.gk_proj
    gk = x @ low_rank.weight.T @ full.weight.T + full.bias

    def heads(t, width):  # (B, H, L, width)
        return t.reshape(B, x.shape[1], HEADS, width).transpose(1, 2)

    dk, dv = layer.head_k, layer.head_v
    tau = layer.core.gate_temperature
    o = gla_reference(heads(q, dk), heads(k, dk), heads(v, dv), heads(gk, dk), tau)
    o = o.transpose(1, 2)  # (B, L, H, dv)
    normed = o / (o.pow(2).mean(-1, keepdim=True) + layer.norm.eps).sqrt() * layer.norm.weight
    if layer.use_output_gate:
        g = layer.g_proj(x).reshape(B, x.shape[1], HEADS, dv)
        normed = normed * g * torch.sigmoid(g)  # swish after the norm
    return normed.reshape(B, x.shape[1], -1) @ layer.o_proj.weight.T


@pytest.mark.parametrize("options", SETTINGS[:3])
def test_forward_follows_the_reference_layer(options):
    layer = build(**options)
    x = sequence(37)
    torch.testing.assert_close(layer(x), written_out(layer, x), rtol=1e-10, atol=1e-10)


def test_causal():
    layer = build(chunk_size=16, use_short_conv=True)
    x = sequence(40)
    changed = x.clone()
    changed[:, 23] += 3.0
    before, after = layer(x), layer(changed)
    torch.testing.assert_close(before[:, :23], after[:, :23], rtol=0, atol=0)
    assert (before[:, 23] - after[:, 23]).abs().max() > 1e-3
    with pytest.raises(ValueError, match="causal only"):
        layer(x, causal=False)


def test_published_sizes_and_initial_values():
    assert layer_of(MECHANISMS.get("gla")) is GLALayer
    assert GatedLinearAttention.layer is GLALayer
    torch.manual_seed(0)
    layer = GLALayer(D_MODEL, HEADS)
    # expand_k 0.5, expand_v 1: heads of 8 key and 16 value coordinates
    assert (layer.key_dim, layer.value_dim, layer.head_k, layer.head_v) == (32, 64, 8, 16)
    assert layer.q_proj.weight.shape == layer.k_proj.weight.shape == (32, D_MODEL)
    assert layer.v_proj.weight.shape == layer.g_proj.weight.shape == (64, D_MODEL)
    assert layer.o_proj.weight.shape == (D_MODEL, 64)
    for proj in (layer.q_proj, layer.k_proj, layer.v_proj, layer.g_proj, layer.o_proj):
        assert proj.bias is None
    # the low-rank forget gate: d_model -> 16 (no bias) -> key_dim (with bias)
    low_rank, full = layer.gk_proj
    assert low_rank.weight.shape == (16, D_MODEL) and low_rank.bias is None
    assert full.weight.shape == (32, 16) and full.bias.shape == (32,)
    # log alpha = logsigmoid(.) / 16
    assert layer.core.gate_temperature == 16.0
    assert layer.core.chunk_size == 64
    # the per-head norm before the swish gate, weights one, eps 1e-5; no convolution
    assert isinstance(layer.norm, GatedRMSNorm) and layer.norm.norm_before_gate
    assert layer.norm.eps == 1e-5 and torch.equal(layer.norm.weight, torch.ones(16))
    assert not hasattr(layer, "q_conv")
    assert layer.state_size(256) == HEADS * 8 * 16
    conv = GLALayer(D_MODEL, HEADS, use_short_conv=True)
    assert conv.q_conv.kernel == 4 and conv.q_conv.conv.bias is None
    assert conv.state_size(256) == HEADS * 8 * 16 + 3 * (32 + 32 + 64)
    plain = GLALayer(D_MODEL, HEADS, use_output_gate=False)
    assert isinstance(plain.norm, RMSNorm) and not hasattr(plain, "g_proj")


def test_log_decay_is_the_published_gate():
    """With q = k = 1 and v = 1 per coordinate, the layer's core decays by exactly
    sigmoid(gk)^(1/16), gk from the low-rank projection."""
    layer = build(chunk_size=16)
    x = sequence(3)
    gk = layer.gk_proj(x)  # (B, L, key_dim)
    alpha = torch.sigmoid(gk) ** (1 / 16)
    torch.testing.assert_close(alpha.log(), F.logsigmoid(gk) / 16)
    state = layer.initial_state(B, x.device, x.dtype)
    _, state = layer.step(state, x[:, 0])
    s0 = state["S"]
    _, state = layer.step(state, x[:, 1])
    q, k, v = (p(x[:, 1]).reshape(B, HEADS, -1) for p in (layer.q_proj, layer.k_proj, layer.v_proj))
    expected = alpha[:, 1].reshape(B, HEADS, -1, 1) * s0 + k.unsqueeze(-1) * v.unsqueeze(-2)
    torch.testing.assert_close(state["S"], expected)


@pytest.mark.parametrize("options", [dict(), dict(use_short_conv=True, use_output_gate=False)])
def test_backward_reaches_every_parameter(options):
    layer = build(dtype=torch.float32, chunk_size=16, **options)
    x = sequence(45, dtype=torch.float32).requires_grad_(True)
    layer(x).pow(2).mean().backward()
    for name, p in layer.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name
    assert torch.isfinite(x.grad).all()


def test_options():
    params = layer_params("gla", GLALayer, {"use_short_conv": True, "gate_logit_normalizer": 8})
    assert params["use_short_conv"] is True and params["gate_logit_normalizer"] == 8.0
    assert params["expand_k"] == 0.5 and params["gate_low_rank_dim"] == 16
    with pytest.raises(ValueError, match="no parameter use_short_convolution.*use_short_conv"):
        layer_params("gla", GLALayer, {"use_short_convolution": True})
    with pytest.raises(ValueError, match="must be bool"):
        layer_params("gla", GLALayer, {"use_output_gate": 1})
    bad = [
        (dict(expand_k=0.3), "expand_k"),  # 19 key coordinates over 4 heads
        (dict(expand_v=0), "expand_v must be a number > 0"),
        (dict(gate_low_rank_dim=0), "gate_low_rank_dim"),
        (dict(gate_logit_normalizer=-1.0), "gate_logit_normalizer"),
        (dict(gate_logit_normalizer=float("inf")), "gate_logit_normalizer"),
        (dict(conv_size=0), "conv_size"),
        (dict(norm_eps=0.0), "norm_eps"),
        (dict(chunk_size=0), "chunk_size"),
        (dict(use_short_conv="yes"), "use_short_conv"),
    ]
    for options, message in bad:
        with pytest.raises(ValueError, match=message) as caught:
            GLALayer(D_MODEL, HEADS, **options)
        assert "\n" not in str(caught.value)


def test_vmap_over_stacked_copies():
    copies = [
        build(seed=s, dtype=torch.float32, chunk_size=16, use_short_conv=True) for s in (0, 1)
    ]
    params, buffers = stack_module_state(copies)
    x = sequence(21, dtype=torch.float32)

    def run(p, b):
        return functional_call(copies[0], (p, b), (x,))

    out = torch.vmap(run)(params, buffers)
    for i, layer in enumerate(copies):
        torch.testing.assert_close(out[i], layer(x), rtol=1e-5, atol=1e-5)
