"""BasedLayer, the published Based mixer (mechanisms/based.py, "The published layer"): the
token-by-token ``step`` against the parallel ``forward`` in float64 for several option
settings and lengths that no chunk divides; ``forward`` against the three steps rebuilt here
from the module's readable references; causality; the source's structure and defaults;
gradients; option checking; torch.func vmap over stacked parameter copies; the state size."""

from __future__ import annotations

import inspect
import math

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call, stack_module_state, vmap

from synthbench.core.layer import layer_of, layer_params, recurrent_layer_forward
from synthbench.mechanisms.based import BASED_EPS, Based, BasedLayer, based_reference
from synthbench.mechanisms.window import sliding_window_reference

D_MODEL, HEADS = 64, 4


@pytest.fixture(autouse=True)
def _one_thread(single_thread):
    """The tensors here are tiny: one intra-op thread is faster on a shared machine."""


def build(seed=0, d_model=D_MODEL, heads=HEADS, **options) -> BasedLayer:
    """A float64 layer whose every parameter is moved off its initial value (norm weights
    not all ones, biases not uniform), so that no part is degenerate."""
    torch.manual_seed(seed)
    layer = BasedLayer(d_model, heads, **options).double()
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.3 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    return layer


def inputs(length, seed=1, batch=2, d_model=D_MODEL, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, length, d_model, generator=g, dtype=torch.float64)
    return x.requires_grad_(requires_grad)


# options, lengths: the defaults (one chunk, then two uneven ones); no convolution; no window;
# a short window and odd chunk; feature_dim above head_dim (8 heads of 8); kernel 1
SETTINGS = [
    ({}, (37, 70)),
    ({"use_conv": False}, (45,)),
    ({"use_window": False, "feature_dim": 4, "chunk_size": 7}, (30,)),
    ({"window": 5, "chunk_size": 7, "conv_size": 4, "conv_expand": 3}, (23,)),
    ({"heads": 8, "feature_dim": 12, "window": 9, "chunk_size": 10}, (31,)),
    ({"conv_size": 1, "use_window": False, "chunk_size": 16}, (33,)),
]


@pytest.mark.parametrize(("options", "lengths"), SETTINGS)
def test_step_by_step_equals_the_parallel_forward(options, lengths):
    layer = build(**options)
    for length in lengths:
        x = inputs(length)
        parallel = layer(x)
        assert parallel.shape == x.shape
        assert parallel.abs().mean() > 1e-2  # not a trivial output
        torch.testing.assert_close(recurrent_layer_forward(layer, x), parallel, atol=1e-10, rtol=0)


def test_forward_is_the_three_residual_steps_of_the_docstring():
    """Rebuilt from the module's readable references (based_reference with no window head,
    sliding_window_reference) and a causal conv written here: c, then a on RMSNorm(x + c),
    then w on RMSNorm(x + c + a); the output is c + a + w."""
    layer = build(window=6)
    x = inputs(29)
    B, L, D = x.shape

    def heads(t, width):
        return t.view(B, L, HEADS, width).transpose(1, 2)

    def merge(t):
        return t.transpose(1, 2).reshape(B, L, D)

    def rmsnorm(t, norm):
        return t / torch.sqrt(t.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight

    u, g = layer.conv_in(x).chunk(2, dim=-1)
    weight = layer.conv.conv.weight  # (channels, 1, kernel)
    conv = F.conv1d(F.pad(u.transpose(1, 2), (2, 0)), weight, groups=u.shape[-1])
    c = layer.conv_out(F.silu(conv.transpose(1, 2)) * g)
    h = rmsnorm(x + c, layer.taylor_norm)
    q, k = heads(layer.q_proj(h), 16), heads(layer.k_proj(h), 16)
    a = layer.o_proj(merge(based_reference(q, k, heads(layer.v_proj(h), 16), 16, 6, 0)))
    q, k, v = layer.window_qkv(rmsnorm(x + c + a, layer.window_norm)).chunk(3, dim=-1)
    w = layer.window_out(
        merge(sliding_window_reference(heads(q, 16), heads(k, 16), heads(v, 16), 6))
    )
    torch.testing.assert_close(layer(x), c + a + w, atol=1e-12, rtol=0)


@pytest.mark.parametrize("options", [{}, {"window": 3, "chunk_size": 5}])
def test_changing_a_position_leaves_every_earlier_output_unchanged(options):
    layer = build(**options)
    x = inputs(40)
    base = layer(x)
    for t in (0, 17, 39):
        changed = x.clone()
        changed[:, t] += torch.randn_like(changed[:, t])
        out = layer(changed)
        torch.testing.assert_close(out[:, :t], base[:, :t], atol=0, rtol=0)
        assert (out[:, t] - base[:, t]).abs().max() > 1e-6
    with pytest.raises(ValueError, match="causal only"):
        layer(x, causal=False)


def test_the_source_structure_defaults_and_initial_values():
    """BaseConv's in/out Linears have biases and its conv none (based/models/mixers/
    convolution.py, use_bias True, expand_proj 4, kernel 3); the attentions' projections have
    none; q and k are feature_dim (16) wide per head; eps 1e-12 (linear_attention.py); the
    RMSNorms start at ones with eps 1e-5; window 4 (the paper's 64 of 2,048, sec. 4, at the
    suite's 128-token recall inputs: mechanisms/based.py ``WINDOW``)."""
    defaults = {
        name: p.default
        for name, p in inspect.signature(BasedLayer.__init__).parameters.items()
        if p.default is not inspect.Parameter.empty
    }
    assert defaults == {
        "feature_dim": 16, "window": 4, "conv_size": 3, "conv_expand": 4, "use_conv": True,
        "use_window": True, "eps": 1e-12, "norm_eps": 1e-5, "chunk_size": 64,
    }  # fmt: skip
    assert BASED_EPS == 1e-12
    layer = BasedLayer(D_MODEL, HEADS)
    shapes = {name: tuple(p.shape) for name, p in layer.named_parameters()}
    assert shapes == {
        "conv_in.weight": (4 * D_MODEL, D_MODEL), "conv_in.bias": (4 * D_MODEL,),
        "conv.conv.weight": (2 * D_MODEL, 1, 3),
        "conv_out.weight": (D_MODEL, 2 * D_MODEL), "conv_out.bias": (D_MODEL,),
        "taylor_norm.weight": (D_MODEL,),
        "q_proj.weight": (HEADS * 16, D_MODEL), "k_proj.weight": (HEADS * 16, D_MODEL),
        "v_proj.weight": (D_MODEL, D_MODEL), "o_proj.weight": (D_MODEL, D_MODEL),
        "window_norm.weight": (D_MODEL,),
        "window_qkv.weight": (3 * D_MODEL, D_MODEL), "window_out.weight": (D_MODEL, D_MODEL),
    }  # fmt: skip
    for norm in (layer.taylor_norm, layer.window_norm):
        assert norm.eps == 1e-5 and torch.equal(norm.weight, torch.ones(D_MODEL))
    assert layer.conv.activation and layer.conv.kernel == 3
    assert (layer.window, layer.feature_dim, layer.eps) == (4, 16, 1e-12)
    # plain Linears keep PyTorch's default init: weights within +-1/sqrt(fan_in)
    assert layer.q_proj.weight.abs().max() <= 1 / math.sqrt(D_MODEL)
    # without the convolution the Taylor step reads the block's input: no norm before it
    assert BasedLayer(D_MODEL, HEADS, use_conv=False).taylor_norm is None
    assert Based.layer is BasedLayer and layer_of(Based) is BasedLayer


def test_backward_gives_finite_gradients_to_every_parameter():
    layer = build(window=8, chunk_size=16)
    x = inputs(41, requires_grad=True)
    layer(x).pow(2).sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    for name, p in layer.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


def test_layer_params_names_an_unknown_option_and_checks_types():
    with pytest.raises(ValueError, match="feature_dim"):
        layer_params("based", BasedLayer, {"feature_dims": 8})
    with pytest.raises(ValueError, match="use_conv must be bool"):
        layer_params("based", BasedLayer, {"use_conv": 1})
    assert layer_params("based", BasedLayer, {"window": 8})["window"] == 8


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"feature_dim": 0}, "feature_dim must be an integer >= 1"),
        ({"window": 0}, "window must be an integer >= 1"),
        ({"conv_size": 0}, "conv_size must be an integer >= 1"),
        ({"conv_expand": 0}, "conv_expand must be an integer >= 1"),
        ({"chunk_size": 1.5}, "chunk_size must be an integer >= 1"),
        ({"use_window": "yes"}, "use_window must be True or False"),
        ({"eps": -1.0}, "eps must be a number >= 0"),
        ({"norm_eps": 0.0}, "norm_eps must be a number > 0"),
        ({"heads": 3}, "n_heads 3 must divide d_model 64"),
        ({"d_model": 5, "heads": 1, "conv_expand": 3}, "conv_expand x d_model must be even"),
    ],
)
def test_a_bad_value_is_a_one_line_value_error(options, message):
    options = dict(options)
    d_model, heads = options.pop("d_model", D_MODEL), options.pop("heads", HEADS)
    with pytest.raises(ValueError, match=message) as info:
        BasedLayer(d_model, heads, **options)
    assert "\n" not in str(info.value)


# the core's "prefix" strategy (taken under torch.func) calls tril_, which vmap runs unbatched
@pytest.mark.filterwarnings("ignore:There is a performance drop")
@pytest.mark.parametrize("feature_dim", [16, 4])
def test_vmap_over_stacked_parameter_copies_gives_each_copy_its_output(feature_dim):
    """At L 35 the Taylor step takes the scores form at feature_dim 16 (273 features) and
    the features form at 4 (21): there, without the layer's switch to the "prefix"
    strategy, the CPU scan (an autograd.Function without a vmap rule) would raise."""
    layers = [build(seed=s, window=7, chunk_size=16, feature_dim=feature_dim) for s in (0, 1)]
    params, buffers = stack_module_state(layers)
    x = inputs(35)

    def run(p, b, x):
        return functional_call(layers[0], (p, b), (x,))

    out = vmap(run, in_dims=(0, 0, None))(params, buffers, x)
    for n, layer in enumerate(layers):
        torch.testing.assert_close(out[n], layer(x), atol=1e-10, rtol=0)


def test_state_size_sums_the_parts():
    """Conv window (3 - 1) x 128 channels, S and z 4 x 273 x 17, keys and values 2 x 4 x 64."""
    assert BasedLayer(D_MODEL, HEADS).state_size(256) == 2 * 128 + 4 * 273 * 17 + 2 * 4 * 64
    assert (
        BasedLayer(D_MODEL, HEADS, use_conv=False, use_window=False).state_size(9) == 4 * 273 * 17
    )
    layer = build(window=5, conv_size=4, feature_dim=3)
    conv, s, z, (keys, values, _) = layer.initial_state(2, "cpu", torch.float64)
    carried = sum(t[0].numel() for t in (conv, s, z, keys, values))
    assert layer.state_size(100) == carried
