"""RetNetLayer, the published RetNet layer (mechanisms/retnet.py, "The published layer"): the
chunked forward against the token-by-token ``step`` (which carries the position for xPos) in
float64 under several option settings; against gated multi-scale retention written out here
from the authors' parallel form (torchscale: its rotation, its normalised decay mask and
score scaling, LayerNorm per head); chunk sizes; causality; the published sizes, decays and
rotation angles; gradients; options; a torch.func vmap over stacked copies."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call, stack_module_state

from synthbench.core.layer import layer_of, layer_params, recurrent_layer_forward
from synthbench.core.mechanism import MECHANISMS
from synthbench.mechanisms.retnet import Retention, RetNetLayer

D_MODEL, HEADS, B = 64, 4, 2


@pytest.fixture(autouse=True)
def _one_thread(single_thread):
    """The tensors here are tiny: one intra-op thread is faster on a shared machine."""


def build(seed=0, dtype=torch.float64, **options):
    """A layer with its projections scaled up from PyTorch's default init, so that the
    scores, the rotation and the gate all matter (the layer has no other parameters)."""
    torch.manual_seed(seed)
    layer = RetNetLayer(D_MODEL, HEADS, **options).to(dtype)
    with torch.no_grad():
        for p in layer.parameters():
            p.mul_(2.0)
    return layer


def sequence(length, seed=1, dtype=torch.float64):
    return torch.randn(B, length, D_MODEL, generator=torch.Generator().manual_seed(seed)).to(dtype)


SETTINGS = [
    dict(chunk_size=16),  # the published defaults otherwise: GroupNorm, swish gate
    dict(chunk_size=7, use_output_gate=False, norm="rms"),
    dict(chunk_size=64, expand_k=0.5, expand_v=1.0, norm_eps=1e-3),
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


def test_chunk_size_does_not_change_the_function():
    x = sequence(53)
    outs = [build(chunk_size=c)(x) for c in (1, 8, 53, 64)]
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0], rtol=1e-10, atol=1e-10)


def authors_parallel_form(layer: RetNetLayer, x: torch.Tensor) -> torch.Tensor:
    """torchscale's parallel MultiScaleRetention (component/multiscale_retention.py with
    architecture/retnet.py RetNetRelPos), written out: k scaled by d_k^(-1/2), both rotated
    by rotate_every_two with angles 1 / 10000^linspace(0, 1, d_k/2), the decay mask divided
    by the square root of its row sums, the scores by clamp(|row sum|, 1), then LayerNorm
    per head without affine, swish(x W_G) and W_O."""
    L, dk, dv = x.shape[1], layer.head_k, layer.head_v
    angle = 1.0 / (10000 ** torch.linspace(0, 1, dk // 2, dtype=x.dtype))
    angle = angle.repeat_interleave(2)  # (d_k,): each pair's angle twice
    index = torch.arange(L, dtype=x.dtype)
    sin, cos = torch.sin(index[:, None] * angle), torch.cos(index[:, None] * angle)

    def shift(t):  # x cos + rotate_every_two(x) sin
        turned = torch.stack((-t[..., 1::2], t[..., 0::2]), dim=-1).flatten(-2)
        return t * cos + turned * sin

    def heads(t, width):
        return t.reshape(B, L, HEADS, width).transpose(1, 2)

    q = shift(heads(layer.q_proj(x), dk))
    k = shift(heads(layer.k_proj(x) * dk**-0.5, dk))
    v = heads(layer.v_proj(x), dv)
    gammas = torch.tensor([1 - 2.0 ** (-5 - h) for h in range(HEADS)], dtype=x.dtype)
    distance = index[:, None] - index[None, :]
    mask = torch.where(distance >= 0, gammas.view(-1, 1, 1) ** distance.clamp(min=0), 0.0)
    mask = mask / mask.sum(-1, keepdim=True).sqrt()
    scores = (q @ k.transpose(-1, -2)) * mask
    scores = scores / scores.abs().sum(-1, keepdim=True).clamp(min=1)
    o = (scores @ v).transpose(1, 2)  # (B, L, H, d_v)
    o = F.layer_norm(o, (dv,), eps=layer.norm_eps).reshape(B, L, -1)
    if layer.use_output_gate:
        o = F.silu(layer.g_proj(x)) * o
    return o @ layer.o_proj.weight.T


@pytest.mark.parametrize("gate", [True, False])
def test_forward_follows_the_authors_layer(gate):
    """Equal but for eps: the authors' extra row scalings cancel in the per-head norm."""
    layer = build(chunk_size=16, norm_eps=1e-14, use_output_gate=gate)
    x = sequence(37)
    torch.testing.assert_close(layer(x), authors_parallel_form(layer, x), rtol=1e-8, atol=1e-8)


def test_causal():
    layer = build(chunk_size=16)
    x = sequence(40)
    changed = x.clone()
    changed[:, 23] += 3.0
    before, after = layer(x), layer(changed)
    torch.testing.assert_close(before[:, :23], after[:, :23], rtol=0, atol=0)
    assert (before[:, 23:] - after[:, 23:]).abs().amax(dim=(0, 2)).min() > 1e-6
    with pytest.raises(ValueError, match="causal only"):
        layer(x, causal=False)


def test_published_sizes_and_initial_values():
    assert layer_of(MECHANISMS.get("retnet")) is RetNetLayer
    assert Retention.layer is RetNetLayer
    layer = RetNetLayer(D_MODEL, HEADS)
    # expand_k 1, expand_v 2: heads of 16 key and 32 value coordinates
    assert (layer.key_dim, layer.value_dim, layer.head_k, layer.head_v) == (64, 128, 16, 32)
    assert layer.q_proj.weight.shape == layer.k_proj.weight.shape == (64, D_MODEL)
    assert layer.v_proj.weight.shape == layer.g_proj.weight.shape == (128, D_MODEL)
    assert layer.o_proj.weight.shape == (D_MODEL, 128)
    for proj in (layer.q_proj, layer.k_proj, layer.v_proj, layer.g_proj, layer.o_proj):
        assert proj.bias is None
    # the only parameters: the five projections (GroupNorm without affine, decays fixed)
    assert {name for name, _ in layer.named_parameters()} == {f"{p}_proj.weight" for p in "qkvgo"}
    # gamma_h = 1 - 2^(-5 - h): 31/32, 63/64, 127/128, 255/256, a buffer
    assert "core.log_decay" in dict(layer.named_buffers())
    expected = [math.log(1 - 2.0 ** (-5 - h)) for h in range(HEADS)]
    torch.testing.assert_close(layer.core.log_decay, torch.tensor(expected, dtype=torch.float64))
    torch.testing.assert_close(layer.core.gamma[:2], torch.tensor([31 / 32, 63 / 64]).double())
    assert layer.core.chunk_size == 64 and layer.core.head_dim == 16
    assert (layer.norm, layer.norm_eps, layer.use_output_gate) == ("group", 1e-5, True)
    assert layer.state_size(256) == HEADS * 16 * 32 + 1


def test_rotation_is_xpos_at_the_position():
    """Pair j of a key at position n turns by n / 10000^(j/7) (d_k = 16: 8 pairs), in the
    parallel form and in the step, whose state counts the positions."""
    layer = build(chunk_size=16, norm_eps=1e-14)
    x = sequence(4)
    state = layer.initial_state(B, x.device, x.dtype)
    assert state["position"].tolist() == [0] * B
    for t in range(3):
        _, state = layer.step(state, x[:, t])
    assert state["position"].tolist() == [3] * B
    s_before = state["S"]
    _, state = layer.step(state, x[:, 3])
    k = layer.k_proj(x[:, 3]).reshape(B, HEADS, 8, 2)
    theta = 3.0 / 10000 ** (torch.arange(8, dtype=x.dtype) / 7)
    turned = torch.stack(
        (k[..., 0] * theta.cos() - k[..., 1] * theta.sin(),
         k[..., 1] * theta.cos() + k[..., 0] * theta.sin()),
        dim=-1,
    ).flatten(-2)  # fmt: skip
    v = layer.v_proj(x[:, 3]).reshape(B, HEADS, 32)
    gamma = layer.core.gamma.view(1, -1, 1, 1)
    expected = gamma * s_before + turned.unsqueeze(-1) * v.unsqueeze(-2)
    torch.testing.assert_close(state["S"], expected, rtol=1e-12, atol=1e-12)


def test_group_norm_is_per_head_without_affine():
    layer = build(norm_eps=1e-5)
    o = torch.randn(3, HEADS, 32, dtype=torch.float64) * 5 + 2
    expected = F.group_norm(o.reshape(3, HEADS * 32), HEADS, eps=1e-5).reshape(3, HEADS, 32)
    torch.testing.assert_close(layer._head_norm(o), expected)


@pytest.mark.parametrize("options", [dict(), dict(use_output_gate=False, norm="rms")])
def test_backward_reaches_every_parameter(options):
    layer = build(dtype=torch.float32, chunk_size=16, **options)
    x = sequence(45, dtype=torch.float32).requires_grad_(True)
    layer(x).pow(2).mean().backward()
    for name, p in layer.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name
    assert torch.isfinite(x.grad).all()


def test_options():
    params = layer_params("retnet", RetNetLayer, {"expand_v": 1, "norm": "rms"})
    assert params["expand_v"] == 1.0 and params["norm"] == "rms"
    assert params["expand_k"] == 1.0 and params["chunk_size"] == 64
    with pytest.raises(ValueError, match="no parameter norm_epsilon.*norm_eps"):
        layer_params("retnet", RetNetLayer, {"norm_epsilon": 1e-6})
    with pytest.raises(ValueError, match="must be bool"):
        layer_params("retnet", RetNetLayer, {"use_output_gate": 1})
    bad = [
        (dict(expand_k=0.3), "expand_k"),  # 19 key coordinates over 4 heads
        (dict(expand_k=0.1875), "must be even"),  # 12 keys: heads of 3
        (dict(expand_v=0), "expand_v must be a number > 0"),
        (dict(norm_eps=0.0), "norm_eps"),
        (dict(norm="layer"), "norm must be 'group' or 'rms'"),
        (dict(chunk_size=0), "chunk_size"),
        (dict(use_output_gate="yes"), "use_output_gate"),
    ]
    for options, message in bad:
        with pytest.raises(ValueError, match=message) as caught:
            RetNetLayer(D_MODEL, HEADS, **options)
        assert "\n" not in str(caught.value)


def test_vmap_over_stacked_copies():
    copies = [build(seed=s, dtype=torch.float32, chunk_size=16) for s in (0, 1)]
    params, buffers = stack_module_state(copies)
    x = sequence(21, dtype=torch.float32)

    def run(p, b):
        return functional_call(copies[0], (p, b), (x,))

    out = torch.vmap(run)(params, buffers)
    for i, layer in enumerate(copies):
        torch.testing.assert_close(out[i], layer(x), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(out[0], out[1])
