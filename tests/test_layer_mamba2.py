"""Mamba2Layer, Mamba-2's published mixer (mamba_ssm/modules/mamba2.py) in the block track:
its recurrent form against the chunked forward in float64 at several option settings, chunk
sizes that change nothing, causality, the source's initial values and their order of draws,
gradients, option checking, and a torch.func vmap over stacked parameter copies."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, stack_module_state

from synthbench.core.layer import layer_of, layer_params, recurrent_layer_forward
from synthbench.core.mechanism import MECHANISMS
from synthbench.mechanisms.mamba2 import Mamba2, Mamba2Layer

D_MODEL, N_HEADS = 64, 4
CLOSE = {"atol": 1e-10, "rtol": 1e-9}
# option settings: the source's defaults (2 heads of 64, d_state 128) with several chunks;
# 4 groups of B and C over 8 heads, a width-2 convolution; no history in the convolution
SETTINGS = [
    {"chunk_size": 16},
    {"headdim": 16, "d_state": 8, "ngroups": 4, "d_conv": 2, "chunk_size": 5},
    {"expand": 1, "headdim": 8, "d_state": 4, "ngroups": 2, "d_conv": 1, "chunk_size": 7},
]


@pytest.fixture(autouse=True)
def _one_thread(single_thread):
    """The layers here are tiny: one intra-op thread is faster on a shared machine."""


def build(seed=0, dtype=torch.float64, **options):
    torch.manual_seed(seed)
    return Mamba2Layer(D_MODEL, N_HEADS, **options).to(dtype)


def perturbed(layer, seed=1):
    """The layer with nothing at its neutral start: D, the norm's weight and the conv bias
    drawn, dt_bias spread so that softplus(dt_bias) runs from about 0.05 to 3, A_log so
    that the decays per step run from mild to strong."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in (layer.D, layer.norm.weight, layer.conv.conv.bias):
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype))
        layer.dt_bias.copy_(torch.linspace(-3, 3, layer.nheads))
        layer.A_log.copy_(torch.linspace(-1, 2, layer.nheads))
    return layer


def inputs(length, seed=0, batch=2, dtype=torch.float64):
    return torch.randn(batch, length, D_MODEL, generator=torch.Generator().manual_seed(seed)).to(
        dtype
    )


def test_registered_as_the_mechanisms_layer():
    assert Mamba2.layer is Mamba2Layer
    assert layer_of(MECHANISMS.get("mamba2")) is Mamba2Layer


@pytest.mark.parametrize("options", SETTINGS)
@pytest.mark.parametrize("length", [1, 5, 23])
def test_recurrent_form_equals_forward(options, length):
    layer = perturbed(build(**options))
    x = inputs(length)
    out = layer(x)
    assert out.shape == x.shape and out.abs().max() > 1e-3  # not a degenerate output
    torch.testing.assert_close(recurrent_layer_forward(layer, x), out, **CLOSE)


def test_recurrent_form_equals_forward_at_the_default_chunk():
    """The source's chunk of 256: one chunk for 37 positions; a longer input, several."""
    layer = perturbed(build())
    for x in (inputs(37), inputs(261, batch=1)):
        torch.testing.assert_close(recurrent_layer_forward(layer, x), layer(x), **CLOSE)


def test_chunk_size_changes_nothing():
    x = inputs(41)
    reference = perturbed(build(chunk_size=41))(x)
    for chunk in (1, 6, 16, 256):
        torch.testing.assert_close(perturbed(build(chunk_size=chunk))(x), reference, **CLOSE)


@pytest.mark.parametrize("options", SETTINGS[:2])
def test_causal(options):
    layer = perturbed(build(**options))
    x = inputs(19)
    changed = x.clone()
    changed[:, 11] += 3.0
    before, after = layer(x), layer(changed)
    torch.testing.assert_close(after[:, :11], before[:, :11], atol=0, rtol=0)
    assert (after[:, 11] - before[:, 11]).abs().max() > 1e-6


def test_causal_only():
    layer = build()
    with pytest.raises(ValueError, match="causal only"):
        layer(inputs(3), causal=False)


def test_sizes_follow_the_source():
    """H = expand * d_model / headdim (n_heads is not used), in_proj to [z, x, B, C, dt]."""
    layer = build(dtype=torch.float32)
    assert (layer.nheads, layer.headdim, layer.d_state, layer.d_inner) == (2, 64, 128, 128)
    assert layer.in_proj.weight.shape == (2 * 128 + 2 * 128 + 2, D_MODEL)
    assert layer.in_proj.bias is None and layer.out_proj.bias is None
    assert layer.conv.conv.weight.shape == (128 + 2 * 128, 1, 4)
    assert layer.conv.conv.bias is not None  # conv_bias=True in the source
    assert layer.norm.group_size == 128 and not layer.norm.norm_before_gate
    assert Mamba2Layer(D_MODEL, 1).nheads == Mamba2Layer(D_MODEL, 8).nheads == 2
    grouped = build(headdim=16, ngroups=4, dtype=torch.float32)
    assert (grouped.nheads, grouped.norm.group_size) == (8, 32)
    assert layer.state_size(100) == 3 * (128 + 256) + 2 * 128 * 64
    assert grouped.state_size(7) == 3 * (128 + 2 * 4 * 128) + 8 * 128 * 16


def test_published_initial_values():
    """softplus(dt_bias) log-uniform in [1e-3, 1e-1], A = exp(A_log) uniform in [1, 16],
    D and the norm's weight ones, as mamba_ssm's Mamba2.__init__; none weight-decayed."""
    layer = build(headdim=1, d_state=2, dtype=torch.float32)  # 128 heads to look at
    delta0, a0 = F.softplus(layer.dt_bias.double()), layer.A_log.double().exp()
    assert delta0.min() >= 1e-3 * (1 - 1e-5) and delta0.max() <= 0.1 * (1 + 1e-5)
    assert (delta0 < 1e-2).any() and (delta0 > 1e-2).any()  # both decades
    assert a0.min() >= 1 - 1e-6 and a0.max() <= 16 * (1 + 1e-6) and a0.std() > 2
    assert torch.equal(layer.D, torch.ones(128)) and torch.equal(layer.norm.weight, torch.ones(128))
    for p in (layer.dt_bias, layer.A_log, layer.D):
        assert getattr(p, "_no_weight_decay", False)
    floored = build(dt_min=1e-6, dt_max=1e-5, dt_init_floor=1e-4, dtype=torch.float32)
    torch.testing.assert_close(F.softplus(floored.dt_bias), torch.full((2,), 1e-4))
    ranged = build(A_init_range=(2, 3), headdim=1, d_state=2, dtype=torch.float32)
    assert ranged.A_log.exp().min() >= 2 - 1e-5 and ranged.A_log.exp().max() <= 3 + 1e-5


def test_initial_values_drawn_in_the_sources_order():
    """in_proj, conv1d, then dt (torch.rand) and A (uniform_) from the global generator."""
    layer = build(seed=5, dtype=torch.float32)
    torch.manual_seed(5)
    in_proj = nn.Linear(D_MODEL, 2 * 128 + 2 * 128 + 2, bias=False)
    conv = nn.Conv1d(384, 384, 4, groups=384, bias=True)
    dt = torch.exp(torch.rand(2) * (torch.tensor(0.1).log() - torch.tensor(1e-3).log()))
    dt = (dt * 1e-3).clamp(min=1e-4)
    a = torch.empty(2).uniform_(1, 16)
    torch.testing.assert_close(layer.in_proj.weight, in_proj.weight, atol=0, rtol=0)
    torch.testing.assert_close(layer.conv.conv.weight, conv.weight, atol=0, rtol=0)
    torch.testing.assert_close(F.softplus(layer.dt_bias), dt)
    torch.testing.assert_close(layer.A_log, a.log())


def test_gradients_reach_every_parameter():
    layer = perturbed(build(**SETTINGS[1]))
    x = inputs(13).requires_grad_(True)
    (layer(x) * torch.randn(x.shape, generator=torch.Generator().manual_seed(3))).sum().backward()
    for name, p in [("x", x), *layer.named_parameters()]:
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().max() > 0, name


def test_float32_stays_float32():
    layer = build(dtype=torch.float32)
    assert layer(inputs(9, dtype=torch.float32)).dtype == torch.float32


def test_options_are_checked():
    with pytest.raises(ValueError, match="d_state"):
        layer_params("mamba2", Mamba2Layer, {"d_stat": 64})
    with pytest.raises(ValueError, match="d_state must be int"):
        layer_params("mamba2", Mamba2Layer, {"d_state": 1.5})
    assert layer_params("mamba2", Mamba2Layer, {"headdim": 16})["headdim"] == 16
    bad = [
        {"headdim": 48},
        {"headdim": 0},
        {"ngroups": 3},
        {"d_state": 0},
        {"d_conv": 0},
        {"expand": 0},
        {"chunk_size": 0},
        {"norm_eps": 0.0},
        {"dt_min": 0.0},
        {"dt_min": 0.2},
        {"dt_init_floor": -1.0},
        {"A_init_range": (0, 16)},
        {"A_init_range": (4, 2)},
        {"A_init_range": "wide"},
    ]
    for options in bad:
        with pytest.raises(ValueError) as info:
            Mamba2Layer(D_MODEL, N_HEADS, **options)
        assert "\n" not in str(info.value), options


def test_vmap_over_stacked_copies():
    """Packed training: each of 2 stacked parameter copies gives its own output."""
    copies = [perturbed(build(seed=s, **SETTINGS[1]), seed=s) for s in (0, 1)]
    params, buffers = stack_module_state(copies)
    x = inputs(11)

    def run(p, b):
        return functional_call(copies[0], (p, b), (x,))

    outs = torch.vmap(run)(params, buffers)
    for i, layer in enumerate(copies):
        torch.testing.assert_close(outs[i], layer(x), **CLOSE)
