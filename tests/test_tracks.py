"""The two tracks: ``core`` (each mechanism's rule alone) and ``block`` (its published layer,
synthbench/core/layer.py, in fla's block: RMSNorm before the mixer and the MLP, a final
RMSNorm, the gated SwiGLU MLP, N(0, 0.02) init): protocols, model, the run's
parameters and leak guard, ``synthbench check --track``."""

from __future__ import annotations

import textwrap

import pytest
import torch
from clitools import assert_error, invoke
from torch import nn

from synthbench.core.layer import Layer, RMSNorm, layer_of, recurrent_layer_forward
from synthbench.core.mechanism import MECHANISMS, mixer
from synthbench.core.model import FLA_INIT_STD, FLA_NORM_EPS, GatedMLP, Model, MultiHeadAttention
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
        twin_fields = {
            "arch": "block",
            "version": 5 if core.lr_refine else 4,
            "steps": 2 * core.steps,
        }
        if core.max_steps:  # and twice its cap and chunk
            twin_fields.update(max_steps=2 * core.max_steps, extend_steps=2 * core.extend_steps)
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


def _model(arch: str, mech: str = "softmax", d_model: int = 16) -> Model:
    """A two-layer model of ``arch`` around ``mech`` (its layer where the arch takes one)."""
    return Model(
        16, 8, lambda: mixer(mech, d_model, 2, arch).build({}), d_model=d_model, n_heads=2,
        n_layers=2, arch=arch,
    )  # fmt: skip


@pytest.mark.parametrize("arch", ["block", "block-conv"])
def test_the_block_track_is_flas_block(arch):
    """Version 4 of the block protocols: fla's block (modeling_gated_deltanet.py): RMSNorm
    (eps 1e-6) before the mixer, before the MLP and before the head, the gated MLP, no bias
    in the MLP or the head; block-plain is the block before it; transformer keeps its own."""

    def norms(arch):
        model = _model(arch)
        x = torch.randn(2, 8, 16)
        block = model.blocks[-1]
        kinds = (type(block.norm1).__name__, type(block.norm2).__name__, type(model.norm).__name__)
        # a norm before the mixer: scaling the stream does not scale what the mixer reads
        return kinds, block.norm1(3 * x).allclose(3 * block.norm1(x))

    assert norms(arch) == (("RMSNorm", "RMSNorm", "RMSNorm"), False)
    assert norms("block-plain") == (("Identity", "LayerNorm", "Identity"), True)
    assert norms("transformer") == (("LayerNorm", "LayerNorm", "LayerNorm"), False)
    model = _model(arch)
    assert all(m.eps == FLA_NORM_EPS for m in model.modules() if isinstance(m, RMSNorm))
    assert isinstance(model.blocks[-1].mlp, GatedMLP) and model.head.bias is None
    assert _model("block-plain").head.bias is not None


def test_flas_gated_mlp_is_swiglu_with_flas_width():
    mlp = GatedMLP(64).double()
    assert mlp.up_proj.out_features == 256  # int(64 * 4 * 2 / 3) = 170, up to 256's multiple
    assert GatedMLP(128).up_proj.out_features == 512 and GatedMLP(512).up_proj.out_features == 1536
    assert all(layer.bias is None for layer in (mlp.gate_proj, mlp.up_proj, mlp.down_proj))
    x = torch.randn(3, 5, 64, dtype=torch.float64)
    gate, up = x @ mlp.gate_proj.weight.T, x @ mlp.up_proj.weight.T
    expected = (gate * torch.sigmoid(gate) * up) @ mlp.down_proj.weight.T
    torch.testing.assert_close(mlp(x), expected, rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("mech", ["softmax", "gated-deltanet", "mamba2"])
def test_flas_init_draws_every_linear_and_embedding_from_n_0_002(mech):
    """fla's _init_weights: Linear and Conv1d weights and Embeddings N(0, 0.02), biases zero,
    norms at one; a layer's own parameters (A_log, dt_bias, D) keep their source's values."""
    torch.manual_seed(0)
    model = _model("block", mech, d_model=64)
    drawn = (nn.Linear, nn.Conv1d, nn.Embedding)
    weights = torch.cat([m.weight.flatten() for m in model.modules() if isinstance(m, drawn)])
    assert weights.numel() > 20_000 and abs(weights.std().item() - FLA_INIT_STD) < 1e-3
    assert abs(weights.mean().item()) < 1e-3
    biases = [m.bias for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv1d))]
    assert all(b is None or not b.any() for b in biases)
    assert all((m.weight == 1).all() for m in model.modules() if isinstance(m, RMSNorm))
    if mech != "softmax":  # the layer's own parameters are drawn as when it is built alone
        torch.manual_seed(0)
        plain = _model("block-plain", mech, d_model=64)
        for name in ("A_log", "dt_bias"):
            mine, theirs = (getattr(m.blocks[0].attn, name) for m in (model, plain))
            torch.testing.assert_close(mine, theirs)
    # the plain block keeps PyTorch's defaults: embeddings N(0, 1)
    assert _model("block-plain", mech, d_model=64).tok_emb.weight.std().item() > 0.5
