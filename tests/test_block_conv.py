"""The block track's Based recipe (``arch=block-conv``): Zoology's BaseConv, written out in
float64 by hand, and a model whose even layers are BaseConv and odd layers the mechanism's."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from synthbench.core.layer import BaseConv, recurrent_layer_forward
from synthbench.core.mechanism import mixer
from synthbench.core.model import Model
from synthbench.run.protocols import PROTOCOLS


def base_conv_reference(layer: BaseConv, u: torch.Tensor) -> torch.Tensor:
    """y_t = (b_c + sum_j w_j * u_(t - k + 1 + j)) * (u_t W^T + b) + u_t, positions before
    the first read as 0, channel by channel."""
    weight = layer.conv.conv.weight[:, 0, :]  # (channels, kernel)
    bias = layer.conv.conv.bias
    k = weight.shape[1]
    batch, length, channels = u.shape
    out = torch.empty_like(u)
    for t in range(length):
        convolved = bias.clone().expand(batch, channels).clone()
        for j in range(k):
            source = t - k + 1 + j
            if source >= 0:
                convolved = convolved + weight[:, j] * u[:, source]
        out[:, t] = (
            convolved * (u[:, t] @ layer.projection.weight.T + layer.projection.bias) + u[:, t]
        )
    return out


def test_base_conv_is_zoologys_formula_and_its_step_form_equals_it():
    torch.manual_seed(0)
    layer = BaseConv(8).double()
    u = torch.randn(2, 9, 8, dtype=torch.float64)
    expected = base_conv_reference(layer, u)
    torch.testing.assert_close(layer(u), expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(recurrent_layer_forward(layer, u), expected, rtol=1e-12, atol=1e-12)
    assert layer.state_size(100) == 2 * 8  # the last kernel - 1 = 2 inputs


def test_base_conv_is_causal():
    torch.manual_seed(1)
    layer = BaseConv(4).double()
    u = torch.randn(1, 10, 4, dtype=torch.float64)
    changed = u.clone()
    changed[:, 6:] = torch.randn(1, 4, 4, dtype=torch.float64)
    torch.testing.assert_close(layer(u)[:, :6], layer(changed)[:, :6], rtol=0, atol=0)
    assert not torch.allclose(layer(u)[:, 6:], layer(changed)[:, 6:])
    with pytest.raises(ValueError, match="causal only"):
        layer(u, causal=False)


@pytest.mark.parametrize("mechanism, layer", [("deltanet", "DeltaNetLayer"), ("softmax", None)])
def test_even_layers_are_base_conv_and_odd_layers_the_mechanism(mechanism, layer):
    built = mixer(mechanism, 32, 4, "block-conv")
    model = Model(
        12, 16, lambda: built.build({}), d_model=32, n_heads=4, n_layers=4, arch="block-conv"
    )
    kinds = [type(block.attn).__name__ for block in model.blocks]
    odd = layer or "MultiHeadAttention"  # the attention family enters as its core
    assert kinds == ["BaseConv", odd, "BaseConv", odd]
    assert model(torch.randint(0, 12, (2, 16))).shape == (2, 16, 12)


def test_the_recipe_needs_a_second_layer_and_belongs_to_the_block_track():
    quick_block = PROTOCOLS.get("quick-block")
    recipe = dataclasses.replace(quick_block, arch="block-conv")
    assert recipe.track == "block"
    with pytest.raises(ValueError, match="block-conv needs n_layers >= 2"):
        dataclasses.replace(quick_block, arch="block-conv", n_layers=1)
    with pytest.raises(ValueError, match="block-conv needs n_layers >= 2"):
        Model(12, 16, lambda: BaseConv(32), d_model=32, n_layers=1, arch="block-conv")
