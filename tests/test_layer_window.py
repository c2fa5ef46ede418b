"""sliding-window's published layer (Mistral 7B's attention: q, k, v projections, rotary
positions on q and k, the windowed softmax, output projection): the recurrent form (a rolling
cache of rotated keys and values) against the parallel one in float64, the whole layer against
a plain reference written from the paper's definitions, causality, the relative-position
property of the rotation, the published defaults, gradients, options, and torch.func vmap."""

from __future__ import annotations

import math

import pytest
import torch
from torch.func import functional_call, stack_module_state

from synthbench.core.layer import layer_of, layer_params, recurrent_layer_forward
from synthbench.core.mechanism import MECHANISMS
from synthbench.mechanisms.window import SlidingWindowLayer, sliding_window_reference

D_MODEL, HEADS = 16, 4  # head_dim 4: two rotated pairs per head


@pytest.fixture(autouse=True)
def _one_thread(single_thread):
    """The tensors here are tiny: one intra-op thread is faster on a shared machine."""


def build(seed=0, d_model=D_MODEL, n_heads=HEADS, **options):
    torch.manual_seed(seed)
    return SlidingWindowLayer(d_model, n_heads, **options).double()


def inputs(length, seed=1, batch=2, d_model=D_MODEL):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, length, d_model, generator=g, dtype=torch.float64)


def reference_layer(layer, x, causal=True):
    """The layer written from its definitions: W_q, W_k, W_v; each head's pairs (x_2i, x_2i+1)
    rotated by p theta^(-2i / d) at position p (Mistral's rope.py, in the real form); the
    plain masked softmax over the window; W_o."""
    batch, length, _ = x.shape
    h, d = layer.n_heads, layer.head_dim
    q, k, v = (
        (x @ proj.weight.T).reshape(batch, length, h, d).transpose(1, 2)
        for proj in (layer.q_proj, layer.k_proj, layer.v_proj)
    )
    if layer.rotary:
        i = torch.arange(d // 2, dtype=torch.float64)
        freqs = 1.0 / layer.rope_theta ** (2 * i / d)
        angle = torch.arange(length, dtype=torch.float64)[:, None] * freqs  # (L, d / 2)
        cos, sin = angle.cos(), angle.sin()

        def rotate(t):
            even, odd = t[..., 0::2], t[..., 1::2]
            return torch.stack((even * cos - odd * sin, even * sin + odd * cos), -1).flatten(-2)

        q, k = rotate(q), rotate(k)
    out = sliding_window_reference(q, k, v, layer.window, causal)
    return out.transpose(1, 2).reshape(batch, length, h * d) @ layer.o_proj.weight.T


# (options, length): rotary at a small base (angles far from 0) with the window shorter
# than, equal to and longer than the block and lengths that divide no block; no rotary; the
# defaults at a length past the window
OPTIONS = [
    ({"window": 5, "chunk_size": 4, "rope_theta": 7.0}, 13),
    ({"window": 4, "chunk_size": 4}, 11),
    ({"window": 9, "chunk_size": 4, "rope_theta": 100.0}, 23),
    ({"window": 3, "chunk_size": 5, "rotary": False}, 12),
    ({}, 70),
]


@pytest.mark.parametrize(("options", "length"), OPTIONS)
def test_recurrent_form_equals_forward(options, length):
    layer = build(**options)
    x = inputs(length)
    torch.testing.assert_close(recurrent_layer_forward(layer, x), layer(x), atol=1e-10, rtol=1e-9)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize(("options", "length"), OPTIONS)
def test_forward_equals_the_reference_layer(options, length, causal):
    layer = build(**options)
    x = inputs(length)
    expected = reference_layer(layer, x, causal)
    torch.testing.assert_close(layer(x, causal=causal), expected, atol=1e-10, rtol=1e-9)


def test_rotary_changes_the_output():
    x = inputs(13)
    with_rotary = build(window=5, rope_theta=7.0)(x)
    without = build(window=5, rope_theta=7.0, rotary=False)(x)
    assert (with_rotary - without).abs().max() > 1e-3


def test_scores_depend_on_relative_positions_only():
    """A window's output sees positions only through i - j: the same tokens shifted by s
    positions give the same output once the window lies inside the sequence."""
    window, shift = 4, 7
    layer = build(window=window, chunk_size=3, rope_theta=5.0)
    x = inputs(10)
    shifted = torch.cat([inputs(shift, seed=9), x], dim=1)
    start = window - 1  # outputs from here on see a full window of x
    torch.testing.assert_close(
        layer(shifted)[:, shift + start :], layer(x)[:, start:], atol=1e-10, rtol=1e-9
    )


def test_causal():
    layer = build(window=6, chunk_size=4, rope_theta=9.0)
    x = inputs(15)
    out = layer(x)
    for t in (0, 5, 14):
        changed = x.clone()
        changed[:, t] += torch.randn_like(changed[:, t])
        after = layer(changed)
        torch.testing.assert_close(after[:, :t], out[:, :t], atol=0, rtol=0)
        assert (after[:, t] - out[:, t]).abs().max() > 1e-6


def test_published_defaults_and_parameters():
    """Mistral 7B: bias-free q, k, v and output projections (transformer_layers.py
    ``Attention``), rotary base 10000 with frequencies theta^(-2i / head_dim) (rope.py
    ``precompute_freqs_cis``); the core's window, 16 (Longformer's 1/8 of the input at the
    suite's scale: mechanisms/window.py ``WINDOW``)."""
    layer = SlidingWindowLayer(64, 4)
    assert (layer.window, layer.chunk_size, layer.rotary, layer.rope_theta) == (
        16,
        64,
        True,
        10000.0,
    )
    shapes = {name: tuple(p.shape) for name, p in layer.named_parameters()}
    assert shapes == {f"{n}_proj.weight": (64, 64) for n in "qkvo"}
    expected = 10000.0 ** (-torch.arange(0, 16, 2, dtype=torch.float64) / 16)
    torch.testing.assert_close(layer.frequencies, expected, atol=0, rtol=0)
    assert "frequencies" not in layer.state_dict()  # derived from rope_theta
    assert layer.state_size(256) == layer.state_size(1024) == 2 * 16 * 16 * 4  # window 16


def test_registered_on_the_mechanism():
    assert layer_of(MECHANISMS.get("sliding-window")) is SlidingWindowLayer


def test_state_is_the_rolling_cache():
    """keys (already rotated), values (batch, heads, window, head_dim) and the position."""
    layer = build(window=3)
    state = layer.initial_state(2, "cpu", torch.float64)
    x = inputs(5)
    for t in range(5):
        _, state = layer.step(state, x[:, t])
    keys, values, position = state
    assert keys.shape == values.shape == (2, HEADS, 3, D_MODEL // HEADS) and position == 5
    last = layer.v_proj(x[:, -1]).unflatten(-1, (HEADS, -1))
    torch.testing.assert_close(values[:, :, -1], last)


@pytest.mark.parametrize("rotary", [True, False])
def test_backward_reaches_every_parameter(rotary):
    layer = build(window=5, chunk_size=4, rotary=rotary)
    x = inputs(11).requires_grad_(True)
    layer(x).pow(2).sum().backward()
    for name, p in layer.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().max() > 0, name
    assert torch.isfinite(x.grad).all()


def test_unknown_option_names_the_close_match():
    with pytest.raises(ValueError, match="window") as err:
        layer_params("sliding-window", SlidingWindowLayer, {"windw": 8})
    assert "windw" in str(err.value)
    assert (
        layer_params("sliding-window", SlidingWindowLayer, {"rope_theta": 500})["rope_theta"]
        == 500.0
    )


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"window": 0}, "window"),
        ({"chunk_size": 0}, "chunk_size"),
        ({"rotary": 1}, "rotary"),
        ({"rope_theta": -1.0}, "rope_theta"),
        ({"rope_theta": 0}, "rope_theta"),
    ],
)
def test_bad_value_is_a_one_line_error(options, words):
    with pytest.raises(ValueError, match=words) as err:
        SlidingWindowLayer(D_MODEL, HEADS, **options)
    assert "\n" not in str(err.value)


def test_bad_shapes_are_one_line_errors():
    with pytest.raises(ValueError, match="multiple of n_heads"):
        SlidingWindowLayer(18, 4)
    with pytest.raises(ValueError, match="even head_dim"):
        SlidingWindowLayer(12, 4)  # head_dim 3
    SlidingWindowLayer(12, 4, rotary=False)  # an odd head_dim is fine without rotation
    with pytest.raises(ValueError, match="rotary must be"):
        layer_params("sliding-window", SlidingWindowLayer, {"rotary": "yes"})


def test_vmap_over_stacked_copies():
    """Packed training: vmap of functional_call over stacked parameters and buffers."""
    copies = [build(seed=s, window=5, chunk_size=4, rope_theta=7.0) for s in (3, 4)]
    params, buffers = stack_module_state(copies)
    x = inputs(9)

    def run(p, b):
        return functional_call(copies[0], (p, b), (x,))

    out = torch.vmap(run)(params, buffers)
    for i, layer in enumerate(copies):
        torch.testing.assert_close(out[i], layer(x), atol=1e-12, rtol=1e-10)


def test_float32_matches_float64():
    layer = build(window=6, chunk_size=4)
    x = inputs(17)
    expected = layer(x)
    out = layer.float()(x.float())
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-4)
    assert math.isfinite(out.abs().max().item())
