"""The model around the mechanism: shapes, causality, positions, what attn-only contains."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch import nn

from synthbench.core.mechanism import MECHANISMS
from synthbench.core.model import ARCHS, POSITIONS, SHORT_CONV, Model, sinusoidal_positions

VOCAB, MAX_LEN, D, HEADS, LAYERS = 11, 80, 16, 2, 2
L = 70  # crosses the 64-position chunk of the linear-attention core

pytestmark = pytest.mark.usefixtures("single_thread")


def make_model(mech: str = "softmax", arch: str = "attn-only", pos: str = "learned", **kw):
    torch.manual_seed(0)
    cls = MECHANISMS.get(mech)
    return Model(
        VOCAB,
        kw.pop("max_len", MAX_LEN),
        lambda: cls(D // HEADS, HEADS),
        d_model=D,
        n_heads=HEADS,
        n_layers=LAYERS,
        arch=arch,
        pos=pos,
        **kw,
    )


def tokens(n: int = 3, length: int = L, seed: int = 0) -> torch.Tensor:
    return torch.randint(VOCAB, (n, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("arch,pos", list(itertools.product(ARCHS, POSITIONS)))
@pytest.mark.parametrize("mech", ["softmax", "linear"])
def test_logits_shape(mech, arch, pos):
    model = make_model(mech, arch, pos)
    for length in (1, L, MAX_LEN):
        logits = model(tokens(length=length))
        assert logits.shape == (3, length, VOCAB)
        assert logits.dtype == torch.float32
        assert torch.isfinite(logits).all()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("mech", ["softmax", "linear"])
@pytest.mark.parametrize("pos", ["learned", "sinusoidal", "rope", "rope-cayley"])
def test_whole_model_is_causal(mech, arch, pos):
    model = make_model(mech, arch, pos).double().eval()
    x = tokens()
    with torch.no_grad():
        base = model(x)
        for t in (0, 5, 63, 64, L - 2):
            changed = x.clone()
            changed[:, t + 1 :] = (changed[:, t + 1 :] + 1 + torch.arange(L - t - 1)) % VOCAB
            assert not torch.equal(changed[:, t + 1 :], x[:, t + 1 :])
            out = model(changed)
            torch.testing.assert_close(out[:, : t + 1], base[:, : t + 1], atol=1e-12, rtol=0)
            # the change is seen from position t + 1 on (the check above can fail)
            assert not torch.allclose(out[:, t + 1 :], base[:, t + 1 :])


@pytest.mark.parametrize("mech", ["softmax", "linear"])
def test_non_causal_mode_sees_the_future(mech):
    """Sanity check of the causality test: without the mask, early logits do change."""
    model = make_model(mech).double().eval()
    x = tokens()
    changed = x.clone()
    changed[:, -1] = (changed[:, -1] + 1) % VOCAB
    with torch.no_grad():
        assert not torch.allclose(model(x, causal=False)[:, 0], model(changed, causal=False)[:, 0])


def test_max_len_exceeded_raises():
    model = make_model(max_len=10)
    assert model(tokens(length=10)).shape == (3, 10, VOCAB)
    with pytest.raises(ValueError, match="max_len"):
        model(tokens(length=11))


@pytest.mark.parametrize("pos", ["sinusoidal", "none"])
def test_max_len_exceeded_raises_without_learned_positions(pos):
    model = make_model(pos=pos, max_len=10)
    with pytest.raises(ValueError, match="max_len"):
        model(tokens(length=11))


@pytest.mark.parametrize("pos", POSITIONS)
def test_attn_only_has_no_norm_or_mlp(pos):
    model = make_model(arch="attn-only", pos=pos)
    assert not any(isinstance(m, (nn.LayerNorm, nn.GELU)) for m in model.modules())
    assert not any("mlp" in name or "norm" in name for name, _ in model.named_parameters())
    # exactly: embeddings, per layer qkv + out projections (and learned rotations), head
    expected = VOCAB * D + (MAX_LEN * D if pos == "learned" else 0)
    expected += LAYERS * ((D * 3 * D + 3 * D) + (D * D + D))
    head_dim = D // HEADS
    rotation = {"rope-learned": head_dim // 2, "rope-cayley": head_dim // 2 + head_dim**2}
    expected += LAYERS * HEADS * rotation.get(pos, 0)
    expected += D * VOCAB + VOCAB
    assert sum(p.numel() for p in model.parameters()) == expected


def test_transformer_has_norms_and_mlps():
    model = make_model(arch="transformer")
    norms = [m for m in model.modules() if isinstance(m, nn.LayerNorm)]
    assert len(norms) == 2 * LAYERS + 1
    assert sum(isinstance(m, nn.GELU) for m in model.modules()) == LAYERS


def test_position_encodings_change_the_output():
    """Positions are used: the same token at two positions gets different logits, except
    with pos='none' and a permutation-invariant first layer input."""
    x = torch.full((1, 8), 3)
    for pos in ("learned", "sinusoidal"):
        logits = make_model(pos=pos)(x)
        assert not torch.allclose(logits[0, 0], logits[0, 5])
    logits = make_model(pos="none")(x)
    torch.testing.assert_close(logits[0, 0], logits[0, 5])


@pytest.mark.parametrize("max_len,d_model", [(50, 16), (7, 5)])
def test_sinusoidal_positions_values(max_len, d_model):
    table = sinusoidal_positions(max_len, d_model)
    assert table.shape == (max_len, d_model)
    for p in (0, 1, 3, max_len - 1):
        for i in range(d_model):
            angle = p / 10000 ** (2 * (i // 2) / d_model)
            expected = math.sin(angle) if i % 2 == 0 else math.cos(angle)
            assert table[p, i].item() == pytest.approx(expected, abs=1e-5), (p, i)


def test_sinusoidal_buffer_is_the_table():
    model = make_model(pos="sinusoidal")
    torch.testing.assert_close(model.pos_table, sinusoidal_positions(MAX_LEN, D))
    assert "pos_table" not in model.state_dict()  # derived, not stored


@pytest.mark.parametrize("kwargs", [{"arch": "mlp-mixer"}, {"pos": "rotary"}, {"arch": ""}])
def test_invalid_arch_or_pos_raises(kwargs):
    with pytest.raises(ValueError, match="unknown"):
        make_model(**kwargs)


@pytest.mark.parametrize("mech", MECHANISMS.names())
def test_every_mechanism_trains_with_rotary_positions(mech):
    """A rotation changes only the q and k a mechanism is given: every mechanism runs forward
    and backward with it, with finite outputs and gradients."""
    model = make_model(mech, pos="rope")
    logits = model(tokens(n=2, length=10))
    assert logits.shape == (2, 10, VOCAB) and torch.isfinite(logits).all()
    logits.square().mean().backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("pos", ["rope-learned", "rope-cayley"])
def test_learned_rotations_get_gradients(pos):
    model = make_model(pos=pos)
    model(tokens()).square().mean().backward()
    for block in model.blocks:
        for name, param in block.attn.rotation.named_parameters():
            assert param.grad is not None and param.grad.abs().sum() > 0, name


def test_attn_conv_mixes_the_last_four_tokens_and_no_earlier_one():
    """With a mechanism that mixes nothing (a window of 1 returns v) and one layer,
    attn-conv's position i reads tokens i - 3 .. i through its short convolution
    (SHORT_CONV = 4), and no earlier one."""
    torch.manual_seed(0)
    window = MECHANISMS.get("sliding-window")
    model = Model(VOCAB, MAX_LEN, lambda: window(D // HEADS, HEADS, window=1), d_model=D,
                  n_heads=HEADS, n_layers=1, arch="attn-conv").double().eval()  # fmt: skip
    x = tokens(length=20)
    with torch.no_grad():
        base = model(x)
        for back in range(6):
            changed = x.clone()
            changed[:, 10] = (changed[:, 10] + 1) % VOCAB
            moved = (model(changed)[:, 10 + back] - base[:, 10 + back]).abs().max()
            assert (moved > 1e-9) == (back < SHORT_CONV), back
    assert make_model(arch="attn-only").blocks[0].attn.conv is None  # attn-only: no conv
