"""The two tracks: ``core`` (each mechanism's rule alone) and ``block`` (its published layer,
synthbench/core/layer.py, in one standard pre-norm block): protocols, model, the run's
parameters and leak guard, ``synthbench check --track``."""

from __future__ import annotations

import textwrap

import pytest
import torch
from clitools import assert_error, invoke

from synthbench.core.layer import Layer, layer_of, recurrent_layer_forward
from synthbench.core.mechanism import MECHANISMS
from synthbench.core.model import Model, MultiHeadAttention
from synthbench.integrity.layer_checks import check_layer
from synthbench.run.protocols import PROTOCOLS, protocol_of_track
from synthbench.run.spec import RunSpec

LAYERED = [n for n in MECHANISMS.names() if layer_of(MECHANISMS.get(n)) is not None]


def test_every_protocol_but_the_papers_mirror_has_a_block_twin():
    for name in ("smoke", "quick", "standard"):
        twin = protocol_of_track(name, "block")
        assert twin.name == f"{name}-block" and twin.track == "block" and twin.arch == "block"
        assert protocol_of_track(twin.name, "core").name == name
        assert protocol_of_track(name, None).name == name
        core = PROTOCOLS.get(name)
        # the same protocol but for the block and twice the steps (docs/MECHANISMS.md says why)
        twin_fields = {"arch": "block", "version": 3, "steps": 2 * core.steps}
        assert {**core.config(), **twin_fields} == {
            **twin.config(),
            "name": name,
        }
    with pytest.raises(ValueError, match="unknown track 'blok'; did you mean block"):
        protocol_of_track("quick", "blok")
    with pytest.raises(ValueError, match="slay-paper has no block track"):
        protocol_of_track("slay-paper", "block")


def test_the_cli_refuses_an_unknown_track_in_one_line(tmp_path):
    assert_error(invoke("run", "--track", "blok", "--results", tmp_path), 2, "did you mean block")
    assert_error(
        invoke("run", "--protocol", "slay-paper", "--track", "block", "--results", tmp_path),
        2,
        "no block track",
    )
    assert_error(invoke("check", "softmax", "--track", "bloc"), 2, "did you mean block")


def _spec(mech: str, protocol: str = "smoke-block", **params) -> RunSpec:
    return RunSpec.resolve("copy", mech, PROTOCOLS.get(protocol), 0, mechanism_overrides=params)


def test_the_block_model_takes_the_published_layer_or_the_core_in_plain_projections():
    assert {"deltanet", "gla", "mamba2"} <= set(LAYERED)
    for mech, expected in (("deltanet", Layer), ("softmax", MultiHeadAttention)):
        spec = _spec(mech)
        model = Model(16, 24, spec.make_mechanism, d_model=32, n_heads=2, arch="block")
        assert all(isinstance(b.attn, expected) for b in model.blocks)
        assert model(torch.randint(0, 16, (2, 24))).shape == (2, 24, 16)
    # the core track keeps the rule alone, whatever layer the mechanism has
    core = _spec("deltanet", "smoke")
    assert not isinstance(core.make_mechanism(), Layer)
    with pytest.raises(ValueError, match="belongs in arch=block"):
        Model(16, 24, _spec("deltanet").make_mechanism, d_model=32, n_heads=2)


def test_a_layer_option_is_checked_with_the_close_matches(tmp_path):
    assert "conv_size" in _spec("deltanet").mechanism_params
    typo = "layer deltanet has no parameter conv_sise; did you mean conv_size"
    with pytest.raises(ValueError, match=typo):
        _spec("deltanet", conv_sise=3)
    cli = invoke(
        "run", "--track", "block", "--mech", "gla", "--mech-param", "use_shortconv=false",
        "--results", tmp_path,
    )  # fmt: skip
    assert_error(cli, 2, "layer gla has no parameter use_shortconv; did you mean use_short_conv?")
    # an option of the layer is no parameter of the core track's rule
    with pytest.raises(ValueError, match="mechanism deltanet"):
        _spec("deltanet", "smoke", conv_size=3)


@pytest.mark.parametrize("mech", LAYERED)
def test_every_built_in_layer_passes_its_contract(mech, single_thread):
    params = _spec(mech).mechanism_params
    for result in check_layer(mech, params, 32, 2, [9, 40]):
        assert result.passed, result.line(mech)


def test_the_layer_recurrence_is_the_reference_of_forward():
    layer = _spec("deltanet").make_mechanism().double().eval()
    x = torch.randn(2, 11, 32, dtype=torch.float64)
    torch.testing.assert_close(recurrent_layer_forward(layer, x), layer(x))


LEAKY_LAYER = textwrap.dedent(
    """
    import torch
    from torch import nn
    from synthbench.core.layer import Layer
    from synthbench.core.mechanism import MECHANISMS
    from synthbench.mechanisms.softmax import SoftmaxAttention


    class PeekingLayer(Layer):
        '''Its core is causal; its layer adds the next position's input: a leak.'''

        def __init__(self, d_model, n_heads):
            super().__init__(d_model, n_heads)
            self.proj = nn.Linear(d_model, d_model)

        def forward(self, x, causal=True):
            return self.proj(x + torch.roll(x, -1, dims=1))


    @MECHANISMS.register("peeking", complexity="quadratic", family="test", reference="none")
    class Peeking(SoftmaxAttention):
        layer = PeekingLayer
    """
)


def test_run_refuses_a_leaky_layer_in_the_block_track_and_trains_its_core(tmp_path, forget_plugins):
    plugin = tmp_path / "peeking.py"
    plugin.write_text(LEAKY_LAYER)
    root = tmp_path / "results"
    common = ["--task", "copy", "--mech", "peeking", "--seeds", "1", "--jobs", "1",
              "--plugin", plugin, "--results", root]  # fmt: skip
    refused = invoke("run", "--protocol", "smoke", "--track", "block", *common)
    assert refused.exit_code == 1 and "peeking is not causal (layer-causal" in refused.output
    assert invoke("run", "--protocol", "smoke", *common).exit_code == 0  # its core is causal
    checked = invoke("check", "peeking", "--track", "block", "--length", "12", "--plugin", plugin)
    assert checked.exit_code == 1 and "FAIL  peeking  layer-causal" in checked.output


@pytest.mark.parametrize("arch", ["block", "block-conv"])
def test_the_block_track_norms_only_before_the_mlp(arch):
    """Version 2 of the block protocols: no LayerNorm before the mixer nor before the head
    (with them softmax stays near chance on 16-pair kv_recall in quick's budget:
    synthbench/core/model.py); arch=transformer keeps all three."""

    def norms(arch):
        softmax = MECHANISMS.get("softmax")
        model = Model(16, 8, lambda: softmax(8, 2), d_model=16, n_heads=2, arch=arch)
        x = torch.randn(2, 8, 16)
        block = model.blocks[-1]
        kinds = (type(block.norm1).__name__, type(block.norm2).__name__, type(model.norm).__name__)
        # without a norm before the mixer, scaling the stream scales what the mixer reads
        return kinds, block.norm1(3 * x).allclose(3 * block.norm1(x))

    assert norms(arch) == (("Identity", "LayerNorm", "Identity"), True)
    assert norms("transformer") == (("LayerNorm", "LayerNorm", "LayerNorm"), False)
