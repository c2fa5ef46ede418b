"""The interface for gated and recurrent mechanisms (synthbench/core/mechanism.py): extra per-token
inputs projected by the layer, and a recurrent form (``initial_state``, ``step``) that must
equal the causal ``forward``, for every registered mechanism that has one."""

from __future__ import annotations

import random

import pytest
import torch
from torch import nn

from synthbench.core.mechanism import (
    MECHANISMS,
    Mechanism,
    extra_inputs,
    has_recurrent_form,
    recurrent_forward,
)
from synthbench.core.model import MultiHeadAttention
from synthbench.integrity.causality import Subject, check_leaks
from synthbench.integrity.contract import check_recurrent

HEAD_DIM, HEADS = 8, 2


def build(name: str) -> nn.Module:
    torch.manual_seed(0)
    mechanism = MECHANISMS.get(name)(HEAD_DIM, HEADS)
    if hasattr(mechanism, "set_max_len"):
        mechanism.set_max_len(160)
    return mechanism


RECURRENT = sorted(name for name in MECHANISMS.names() if has_recurrent_form(build(name)))


def random_inputs(mechanism: nn.Module, length: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)

    def draw(width):
        x = torch.randn(2, HEADS, length, width, generator=generator, dtype=torch.float64)
        return x.requires_grad_()

    q, k, v = (draw(HEAD_DIM) for _ in range(3))
    extra = {name: draw(width) for name, width in extra_inputs(mechanism).items()}
    return q, k, v, extra


# around the usual chunk of 64 and past its second boundary; three more drawn once (a fixed
# seed, so a failure reruns) in the slow tier, where they cost 2/3 of this test's CPU
DRAWN = random.Random(16).sample(range(2, 200), 3)
LENGTHS = [1, 7, 63, 64, 65, 130, *(pytest.param(n, marks=pytest.mark.slow) for n in DRAWN)]


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("name", RECURRENT)
def test_step_by_step_equals_the_parallel_form(name, length, single_thread):
    """Forward and backward (every input and every parameter), float64."""
    mechanism = build(name).to(torch.float64).eval()
    q, k, v, extra = random_inputs(mechanism, length)
    parallel = mechanism(q, k, v, causal=True, **extra)
    stepped = recurrent_forward(mechanism, q, k, v, **extra)
    torch.testing.assert_close(stepped, parallel, rtol=1e-9, atol=1e-10)
    weights = torch.randn(parallel.shape, generator=torch.Generator().manual_seed(1),
                          dtype=torch.float64)  # fmt: skip
    wrt = [q, k, v, *extra.values(), *(p for p in mechanism.parameters() if p.requires_grad)]
    grads = torch.autograd.grad((parallel * weights).sum(), wrt, allow_unused=True,
                                materialize_grads=True)  # fmt: skip
    stepped_grads = torch.autograd.grad((stepped * weights).sum(), wrt, allow_unused=True,
                                        materialize_grads=True)  # fmt: skip
    for got, want in zip(stepped_grads, grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-8, atol=1e-10)


def test_some_built_in_has_a_recurrent_form():
    assert RECURRENT, "no registered mechanism exposes initial_state and step"


# -- extra inputs through the layer -------------------------------------------------------------


class GatedMean(Mechanism):
    """A causal running mean of v, each token's write scaled by sigmoid(gate) and its
    output by sigmoid(out_gate): reads two extra inputs, has a recurrent form."""

    def __init__(self, head_dim: int, n_heads: int) -> None:
        super().__init__(head_dim, n_heads)
        self.extra_inputs = {"gate": 1, "out_gate": head_dim}

    def forward(self, q, k, v, causal=True, gate=None, out_gate=None):
        written = torch.sigmoid(gate) * v
        count = torch.arange(1, v.shape[-2] + 1, dtype=v.dtype, device=v.device)[:, None]
        return torch.sigmoid(out_gate) * written.cumsum(-2) / count

    def initial_state(self, batch, device, dtype):
        zeros = torch.zeros(batch, self.n_heads, self.head_dim, device=device, dtype=dtype)
        return zeros, 0

    def step(self, state, q, k, v, gate=None, out_gate=None):
        total, seen = state
        total, seen = total + torch.sigmoid(gate) * v, seen + 1
        return torch.sigmoid(out_gate) * total / seen, (total, seen)


def test_the_layer_projects_the_extra_inputs_a_mechanism_asks_for():
    torch.manual_seed(0)
    layer = MultiHeadAttention(16, 2, GatedMean(8, 2))
    assert layer.extra.out_features == 2 * (1 + 8)
    x = torch.randn(3, 5, 16)
    y = layer(x)
    assert y.shape == x.shape
    grad = torch.autograd.grad(y.sum(), layer.extra.weight)[0]
    assert grad.abs().sum() > 0  # the gates reach the output


def test_a_mechanism_without_extra_inputs_gets_no_extra_projection():
    """Every mechanism written before the interface builds the same layer as before (the
    same parameters in the same order: its stored runs stay reproducible)."""
    torch.manual_seed(0)
    layer = MultiHeadAttention(16, 2, MECHANISMS.get("linear")(8, 2))
    assert not hasattr(layer, "extra")
    assert [name for name, _ in layer.named_parameters()] == [
        "qkv.weight", "qkv.bias", "out.weight", "out.bias"
    ]  # fmt: skip


def test_check_proves_the_recurrent_form_and_the_extras_causal():
    subject = Subject("toy", {}, HEAD_DIM, HEADS)
    MECHANISMS_get = MECHANISMS.get  # noqa: N806 - the registry's own lookup, wrapped below

    def get(name):
        return GatedMean if name == "toy" else MECHANISMS_get(name)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(MECHANISMS, "get", get)
        assert subject.input_names() == ("q", "k", "v", "gate", "out_gate")
        assert all(r.passed for r in check_leaks(subject, [6])), check_leaks(subject, [6])
        assert check_recurrent(subject, [6]).passed


class WrongStep(GatedMean):
    def step(self, state, q, k, v, gate=None, out_gate=None):
        out, state = super().step(state, q, k, v, gate=gate, out_gate=out_gate)
        return out * 1.001, state


class PeeksThroughTheGate(GatedMean):
    def forward(self, q, k, v, causal=True, gate=None, out_gate=None):
        return super().forward(q, k, v, causal, gate.flip(-2), out_gate)


@pytest.mark.parametrize(
    ("cls", "check", "message"),
    [
        (WrongStep, "recurrent", "step by step differs from forward"),
        (PeeksThroughTheGate, "causality", "gate"),
    ],
)
def test_check_catches_a_wrong_step_and_a_leak_through_an_extra_input(cls, check, message):
    subject = Subject("toy", {}, HEAD_DIM, HEADS)
    MECHANISMS_get = MECHANISMS.get  # noqa: N806

    def get(name):
        return cls if name == "toy" else MECHANISMS_get(name)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(MECHANISMS, "get", get)
        if check == "recurrent":
            result = check_recurrent(subject, [6])
        else:
            result = {r.name: r for r in check_leaks(subject, [6])}["causality"]
    assert not result.passed and message in result.detail, result.detail
