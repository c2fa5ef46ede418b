"""Rotary positions (synthbench/core/positional.py): the rotations, their relative-position
property under each kind of mechanism, and the --pos axis of runs (config, run_id, CLI)."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from synthbench.cli import app
from synthbench.core.mechanism import MECHANISMS
from synthbench.core.model import Model, position_params
from synthbench.core.positional import ROTATIONS, CayleyRoPE, LearnedRoPE, RoPE, cayley
from synthbench.run.protocols import PROTOCOLS
from synthbench.run.spec import RunSpec
from synthbench.run.store import ResultStore

pytestmark = pytest.mark.usefixtures("single_thread")

D, HEADS, L = 8, 2, 12
F64 = torch.float64
# `RunSpec.resolve("copy", "softmax", PROTOCOLS.get("quick"), 0).run_id` without --pos (since
# the thread count and lr_extend entered the config, "6e9a532d4fc50137"; before,
# "edfa7ca9c5f2aa65"; suite version 2 and quick v2: "2185a5601d9907e9"; suite version 3 and
# quick v3, with its lr grid and early stop: "e65d000de4e080f6"; quick v4, whose pace_margin
# entered the config, "90f2dc22a19e4bb9"; suite version 4 and quick v5, "f4e8190093c8284f";
# quick v6, recipe v2, "1d3352779ad41ce7"; suite version 5, the ladders, "174541ffec18453d";
# quick v7, recipe v2's knife-edge refinement, since)
QUICK_COPY_SOFTMAX_RUN_ID = "4c55205980d8f98a"


def make_rotation(kind: str, head_dim: int = D, n_heads: int = HEADS, **params) -> RoPE:
    """A float64 rotation; the learned kinds moved away from their initial values, so that
    the checks cover learned frequencies (different per head) and a basis U != I."""
    rotation = ROTATIONS[kind](head_dim, n_heads, **params).double()
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        if isinstance(rotation, LearnedRoPE):
            shape = rotation.learned_frequencies.shape
            rotation.learned_frequencies.mul_(torch.rand(shape, generator=g, dtype=F64) + 0.5)
        if isinstance(rotation, CayleyRoPE):
            shape = rotation.basis_generator.shape
            rotation.basis_generator.copy_(0.3 * torch.randn(shape, generator=g, dtype=F64))
    return rotation


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


# -- the rotations --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ROTATIONS)
def test_rotation_is_special_orthogonal_and_additive(kind):
    rotation = make_rotation(kind)
    eye = torch.eye(D, dtype=F64).expand(HEADS, D, D)
    for a, b in [(0.0, 0.0), (1.0, 2.0), (3.5, -7.25), (40.0, 1000.0)]:
        r_a, r_b = rotation.rotation_matrix(a), rotation.rotation_matrix(b)
        torch.testing.assert_close(r_a.transpose(-1, -2) @ r_a, eye, atol=1e-12, rtol=0)
        torch.testing.assert_close(torch.linalg.det(r_a), torch.ones(HEADS, dtype=F64))
        torch.testing.assert_close(r_a @ r_b, rotation.rotation_matrix(a + b), atol=1e-10, rtol=0)
        # what the scores see: R(a)^T R(b) = R(b - a)
        torch.testing.assert_close(
            r_a.transpose(-1, -2) @ r_b, rotation.rotation_matrix(b - a), atol=1e-10, rtol=0
        )
    torch.testing.assert_close(rotation.rotation_matrix(0.0), eye, atol=1e-15, rtol=0)


@pytest.mark.parametrize("kind", ROTATIONS)
def test_forward_applies_the_rotation_matrix(kind):
    rotation = make_rotation(kind)
    x = randn(3, HEADS, L, D)
    positions = torch.tensor([0, 1, 2, 5, 9, 10, 11, 40, 41, 100, 500, 1000])
    per_position = [
        torch.einsum("hij,bhj->bhi", rotation.rotation_matrix(p), x[:, :, i])
        for i, p in enumerate(positions.tolist())
    ]
    expected = torch.stack(per_position, dim=2)
    torch.testing.assert_close(rotation(x, positions), expected, atol=1e-12, rtol=0)
    # the default positions are 0 .. L-1
    torch.testing.assert_close(rotation(x), rotation(x, torch.arange(L)))


def reference_rope(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0):
    """RoPE written independently: the interleaved pairs as complex numbers times
    exp(i p theta_j), theta_j = base^(-2j / d)."""
    d = x.shape[-1]
    z = torch.view_as_complex(x.reshape(*x.shape[:-1], d // 2, 2).contiguous())
    theta = torch.tensor([base ** (-2 * j / d) for j in range(d // 2)], dtype=F64)
    angle = positions.to(F64)[:, None] * theta
    return torch.view_as_real(z * torch.polar(torch.ones_like(angle), angle)).reshape(x.shape)


@pytest.mark.parametrize("base", [10000.0, 100.0])
def test_rope_matches_the_complex_reference(base):
    x = randn(2, HEADS, L, D)
    positions = torch.arange(L) * 7
    rotation = RoPE(D, HEADS, base=base).double()
    torch.testing.assert_close(rotation(x, positions), reference_rope(x, positions, base))
    # the learned kinds start at rope (their parameters are float32: equal to that precision)
    for cls in (LearnedRoPE, CayleyRoPE):
        learned = cls(D, HEADS, base=base)
        assert torch.equal(learned.frequencies()[1], rotation.frequencies()[1].float())
        torch.testing.assert_close(learned.double()(x, positions), rotation(x, positions),
                                   atol=1e-5, rtol=0)  # fmt: skip


def test_rope_frequencies_and_defaults():
    rotation = RoPE(16, 4)
    assert (rotation.rotate_fraction, rotation.base, rotation.rotated_dims) == (1.0, 10000.0, 16)
    expected = [10000 ** (-2 * i / 16) for i in range(8)]
    assert rotation.frequencies().shape == (4, 8)
    assert rotation.frequencies()[2].tolist() == pytest.approx(expected, rel=1e-12)
    assert list(rotation.parameters()) == []  # fixed: nothing to learn
    assert "fixed_frequencies" not in rotation.state_dict()  # derived from base


def test_learned_kinds_have_per_head_parameters_with_gradients():
    learned, cayley_rope = LearnedRoPE(D, HEADS), CayleyRoPE(D, HEADS)
    assert dict(learned.named_parameters()).keys() == {"learned_frequencies"}
    assert learned.learned_frequencies.shape == (HEADS, D // 2)
    assert dict(cayley_rope.named_parameters()).keys() == {
        "learned_frequencies",
        "basis_generator",
    }
    assert cayley_rope.basis_generator.shape == (HEADS, D, D)
    torch.testing.assert_close(cayley_rope.basis(), torch.eye(D).expand(HEADS, D, D))
    x = torch.randn(2, HEADS, L, D)
    cayley_rope(x).square().sum().backward()
    for p in cayley_rope.parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0


@pytest.mark.parametrize("seed", range(5))
def test_cayley_is_special_orthogonal_and_inverts(seed):
    a = randn(3, D, D, seed=seed) * (seed + 1)
    skew = a - a.transpose(-1, -2)
    u = cayley(skew)
    eye = torch.eye(D, dtype=F64).expand(3, D, D)
    torch.testing.assert_close(u.transpose(-1, -2) @ u, eye, atol=1e-12, rtol=0)
    torch.testing.assert_close(torch.linalg.det(u), torch.ones(3, dtype=F64))
    # the transform is its own inverse: S = (I - U)(I + U)^-1 (seed 004, T3.3)
    torch.testing.assert_close(cayley(u), skew, atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(cayley(torch.zeros(D, D)), torch.eye(D))


@pytest.mark.parametrize("kind", ROTATIONS)
@pytest.mark.parametrize("fraction", [0.25, 0.5, 0.75])
def test_partial_rotation_leaves_the_other_dims_unchanged(kind, fraction):
    rotation = make_rotation(kind, rotate_fraction=fraction)
    rotated = round(fraction * D)
    assert rotation.rotated_dims == rotated
    x = randn(2, HEADS, L, D)
    positions = torch.arange(L) * 13
    y = rotation(x, positions)
    basis = rotation.basis()
    if basis is not None:  # the unrotated subspace is spanned by U's last columns
        x, y = x @ basis, y @ basis
    torch.testing.assert_close(y[..., rotated:], x[..., rotated:], atol=1e-12, rtol=0)
    assert not torch.allclose(y[..., :rotated], x[..., :rotated])
    if kind == "rope":  # the rotated part is rope of the rotated width (its frequencies too)
        reference = reference_rope(x[..., :rotated], positions)
        torch.testing.assert_close(y[..., :rotated], reference)


def test_partial_rotation_of_an_odd_head_size():
    """d 5, 4 rotated: the rotated slice has odd strides (it is copied for the complex view)."""
    x = randn(2, HEADS, L, 5)
    positions = torch.arange(L) * 3
    y = RoPE(5, HEADS, rotate_fraction=0.8).double()(x, positions)
    torch.testing.assert_close(y[..., :4], reference_rope(x[..., :4], positions))
    assert torch.equal(y[..., 4], x[..., 4])


@pytest.mark.parametrize(
    "params,message",
    [
        ({"rotate_fraction": 0.3}, "even number"),  # 2.4 dims
        ({"rotate_fraction": 0.125}, "even number"),  # 1 dim
        ({"rotate_fraction": 1.5}, r"\(0, 1\]"),
        ({"rotate_fraction": 0}, "rotate_fraction must be a number > 0"),
        ({"base": 0.0}, "base must be a number > 0"),
    ],
)
@pytest.mark.parametrize("kind", ROTATIONS)
def test_invalid_rotation_parameters_raise(kind, params, message):
    with pytest.raises(ValueError, match=message):
        ROTATIONS[kind](D, HEADS, **params)


# -- relative positions through the mechanisms ----------------------------------------------

SHIFTS = [1, 37, 1000]
EXACT = ["softmax", "yat", "yat-spherical"]  # deterministic kernels of q.k, |q| and |k|


def rotated_output(mechanism, rotation, q, k, shift: float, causal: bool) -> torch.Tensor:
    """The mechanism on q, k rotated at positions shift, shift + 1, ..., with one-hot values
    (v = I): the output is the attention matrix itself."""
    positions = torch.arange(q.shape[-2]) + shift
    values = torch.eye(q.shape[-2], dtype=F64).expand(*q.shape[:-1], -1)
    return mechanism(rotation(q, positions), rotation(k, positions), values, causal=causal)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kind", ROTATIONS)
@pytest.mark.parametrize("mech", EXACT)
def test_exact_kernels_see_only_relative_positions(mech, kind, causal):
    mechanism = MECHANISMS.get(mech)(D, HEADS).double()
    rotation = make_rotation(kind)
    q, k = randn(2, HEADS, L, D, seed=1), randn(2, HEADS, L, D, seed=2)
    base = rotated_output(mechanism, rotation, q, k, 0, causal)
    assert torch.isfinite(base).all()
    for shift in SHIFTS:
        shifted = rotated_output(mechanism, rotation, q, k, shift, causal)
        torch.testing.assert_close(shifted, base, atol=1e-10, rtol=1e-9)
    # the rotation does act: unrotated inputs give other attention weights
    values = torch.eye(L, dtype=F64).expand(2, HEADS, L, L)
    assert not torch.allclose(mechanism(q, k, values, causal=causal), base, atol=1e-6)


@pytest.mark.parametrize("kind", ROTATIONS)
@pytest.mark.parametrize("mech", ["slay-exact-poly", "slay", "performer"])
def test_random_features_see_a_rotated_draw(mech, kind):
    """Shifting every position by c is the same as rotating the random draw by R(c)^T: for
    projections w (and anchors a), w . R(c) u = (R(c)^T w) . u. The draws are Gaussian, whose
    law no rotation changes, so the shifted scores have the same distribution as the
    unshifted ones. One head: the draw is shared by the heads, the rotation is per head."""
    mechanism = MECHANISMS.get(mech)(D, 1, seed=0).double()
    rotation = make_rotation(kind, n_heads=1)
    q, k = randn(2, 1, L, D, seed=1), randn(2, 1, L, D, seed=2)
    shift = 37
    shifted = rotated_output(mechanism, rotation, q, k, shift, causal=True)
    r = rotation.rotation_matrix(shift)[0]
    drawn = {"omega", "anchors"} if mech.startswith("slay") else {"projection"}
    for name, buffer in mechanism.named_buffers():
        if name in drawn:  # slay's omega is (d, M); anchors and projections are (n, d)
            buffer.copy_(r.T @ buffer if name == "omega" else buffer @ r)
    unshifted = rotated_output(mechanism, rotation, q, k, 0, causal=True)
    torch.testing.assert_close(shifted, unshifted, atol=1e-10, rtol=1e-9)


def test_random_features_average_to_relative_attention():
    """Performer's attention weights (v = I), averaged over redrawn features, agree with and
    without a shift of every position, and with the exact softmax weights they estimate;
    a single draw does not. (Its raw scores carry a per-query, per-draw stabilising factor
    that cancels only in the normalised weights.)"""
    rotation = make_rotation("rope-cayley")
    q, k = randn(1, HEADS, 6, D, seed=1) / 2, randn(1, HEADS, 6, D, seed=2) / 2

    def mean_weights(shift: float, seeds: range) -> torch.Tensor:
        total = 0
        for seed in seeds:
            performer = MECHANISMS.get("performer")(D, HEADS, nb_features=256, seed=seed)
            total = total + rotated_output(performer.double(), rotation, q, k, shift, False)
        return total / len(seeds)

    softmax = MECHANISMS.get("softmax")(D, HEADS)
    exact = rotated_output(softmax, rotation, q, k, 0, causal=False)
    single = mean_weights(100, range(1)) - mean_weights(0, range(1))
    base, shifted = mean_weights(0, range(100)), mean_weights(100, range(100))
    assert single.abs().max() > 0.03  # one draw: the shift moves the weights
    assert (shifted - base).abs().max() < 0.02  # measured 0.004
    assert (base - exact).abs().max() < 0.02 and (shifted - exact).abs().max() < 0.02


# -- the model and the run config -----------------------------------------------------------


@pytest.mark.parametrize("kind", ROTATIONS)
def test_model_with_rotation_adds_no_absolute_position(kind):
    model = Model(11, 20, lambda: MECHANISMS.get("softmax")(8, 2), d_model=16, n_heads=2,
                  pos=kind, pos_params={"rotate_fraction": 0.5})  # fmt: skip
    assert not hasattr(model, "pos_emb") and not hasattr(model, "pos_table")
    rotations = [block.attn.rotation for block in model.blocks]
    assert all(isinstance(r, ROTATIONS[kind]) and r.rotated_dims == 4 for r in rotations)
    assert rotations[0] is not rotations[1]  # each layer its own
    assert model(torch.randint(11, (2, 20))).shape == (2, 20, 11)


def test_position_params():
    assert position_params("learned") == {}
    assert position_params("rope") == {"rotate_fraction": 1.0, "base": 10000.0}
    assert position_params("rope-cayley", {"rotate_fraction": 1}) == {
        "rotate_fraction": 1.0,
        "base": 10000.0,
    }
    with pytest.raises(ValueError, match="did you mean rope"):
        position_params("rop")


def test_default_run_ids_are_unchanged():
    quick = PROTOCOLS.get("quick")
    spec = RunSpec.resolve("copy", "softmax", quick, 0)
    assert spec.run_id == QUICK_COPY_SOFTMAX_RUN_ID
    assert "pos_params" not in spec.config()
    # naming the protocol's own pos is the same run
    assert RunSpec.resolve("copy", "softmax", quick, 0, pos="learned").run_id == spec.run_id


def test_pos_is_in_the_config_and_the_run_id():
    smoke = PROTOCOLS.get("smoke")
    base = RunSpec.resolve("copy", "softmax", smoke, 0)
    rope = RunSpec.resolve("copy", "softmax", smoke, 0, pos="rope")
    assert rope.protocol.pos == "rope" and rope.protocol.name == "smoke"
    assert rope.config()["protocol"]["pos"] == "rope"
    assert rope.config()["pos_params"] == {"rotate_fraction": 1.0, "base": 10000.0}
    variants = [
        base,
        rope,
        RunSpec.resolve("copy", "softmax", smoke, 0, pos="sinusoidal"),
        RunSpec.resolve("copy", "softmax", smoke, 0, pos="none"),
        RunSpec.resolve("copy", "softmax", smoke, 0, pos="rope-learned"),
        RunSpec.resolve("copy", "softmax", smoke, 0, pos="rope-cayley"),
        RunSpec.resolve("copy", "softmax", smoke, 0, pos="rope", pos_overrides={"base": 100}),
        RunSpec.resolve(
            "copy", "softmax", smoke, 0, pos="rope", pos_overrides={"rotate_fraction": 0.5}
        ),
    ]
    assert len({v.run_id for v in variants}) == len(variants)
    # the defaults spelled out are the same run
    same = RunSpec.resolve("copy", "softmax", smoke, 0, pos="rope", pos_overrides={"base": 1e4})
    assert same.run_id == rope.run_id


@pytest.mark.parametrize(
    "pos,overrides,message",
    [
        ("rop", None, "unknown positional encoding 'rop'; did you mean rope"),
        ("rope", {"foo": 1}, "pos rope has no parameter foo"),
        ("rope", {"rotate_fraction": 0.3}, "pos rope: rotate_fraction"),
        ("learned", {"base": 10}, "pos learned has no parameters"),
        (None, {"base": 10}, "pos learned has no parameters"),
    ],
)
def test_resolve_rejects_bad_positions(pos, overrides, message):
    with pytest.raises(ValueError, match=message):
        RunSpec.resolve("copy", "softmax", PROTOCOLS.get("smoke"), 0, None, None, None, pos,
                        overrides)  # fmt: skip


# -- the command line -----------------------------------------------------------------------


def invoke(*args):
    result = CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "250"})
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def test_cli_run_with_rotary_positions(tmp_path):
    root = tmp_path / "results"
    common = ["run", "--task", "copy", "--mech", "softmax", "--protocol", "smoke"]
    result = invoke(*common, "--pos", "rope", "--results", root)
    assert result.exit_code == 0, result.output
    assert "protocol smoke, pos rope (rotate_fraction=1.0, base=10000.0)" in result.stdout
    result = invoke(*common, "--pos", "rope-cayley", "--pos-param", "rotate_fraction=0.5",
                    "--results", root)  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = ResultStore(root).load().rows
    assert len(rows) == 2 and set(rows["status"]) == {"ok"}
    configs = {json.loads(c)["protocol"]["pos"]: json.loads(c) for c in rows["config"]}
    assert configs.keys() == {"rope", "rope-cayley"}
    assert configs["rope"]["pos_params"] == {"rotate_fraction": 1.0, "base": 10000.0}
    assert configs["rope-cayley"]["pos_params"]["rotate_fraction"] == 0.5
    smoke = PROTOCOLS.get("smoke")
    expected = RunSpec.resolve("copy", "softmax", smoke, 0, pos="rope").run_id
    assert expected in set(rows["run_id"])
    # the same command again finds its run stored
    again = invoke(*common, "--pos", "rope", "--results", root)
    assert "1 already stored, 0 to run" in again.stdout


@pytest.mark.parametrize(
    "args,message",
    [
        (["--pos", "rop"], "did you mean rope"),
        (["--pos", "rotary"], "unknown positional encoding 'rotary'"),
        (["--pos", "rope", "--pos-param", "rotate_fraction=0.3"], "rotate_fraction"),
        (["--pos", "rope", "--pos-param", "foo=1"], "no parameter foo"),
        (["--pos", "rope", "--pos-param", "base"], "not of the form key=value"),
        (["--pos-param", "base=100"], "pos learned has no parameters"),
    ],
)
def test_cli_bad_positions_exit_2_with_one_line(tmp_path, args, message):
    root = tmp_path / "results"
    result = invoke("run", "--task", "copy", "--mech", "softmax", "--protocol", "smoke", *args,
                    "--results", root)  # fmt: skip
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], lines
    assert result.stdout == "" and not root.exists()
