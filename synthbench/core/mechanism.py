"""The mechanism interface.

A mechanism is a ``torch.nn.Module`` built from ``(head_dim, n_heads, **params)`` whose
``forward(q, k, v, causal)`` maps (batch, heads, length, head_dim) tensors to one of the
same shape. Projections, positions and residuals belong to the model. Feature-map
mechanisms only define ``feature_map`` and share the causal linear-attention core.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from synthbench.core.interrupts import caught, describe
from synthbench.core.layer import LAYER_ARCHS, Layer, layer_of, layer_params
from synthbench.core.linear_attention import (
    attend_to_factored_scores,
    attend_to_scores,
    compute_dtype,
    functorch_active,
    linear_attention,
    normalise,
)
from synthbench.core.params import check_int, constructor_params
from synthbench.core.registry import Registry

MECHANISMS: Registry[type[nn.Module]] = Registry(
    "mechanism",
    entry_point_group="synthbench.mechanisms",
    builtins="synthbench.mechanisms",
    required=("complexity", "family", "reference"),
    choices={"complexity": ("linear", "quadratic")},
)


class Mechanism(nn.Module):
    """Base class of a mechanism: ``forward(q, k, v, causal)`` on (batch, heads, length,
    head_dim), returning the same shape.

    **Extra inputs.** A gated or recurrent mechanism reads more than q, k and v: a gate, a
    decay, a write strength per token. It names them in ``extra_inputs`` (name -> width per
    head; set it in ``__init__`` where the width follows ``head_dim``): the layer projects its
    input to each (one more Linear, only for a mechanism that asks: synthbench/core/model.py) and
    passes them to ``forward`` as keyword arguments of shape (batch, heads, length, width),
    raw (the mechanism applies its own sigmoid or softplus).

    **Recurrent form.** A mechanism that can generate token by token with a state defines
    ``initial_state(batch, device, dtype)`` and ``step(state, q, k, v, **extra) -> (out,
    state)``, on one position: q, k, v (batch, heads, head_dim), each extra (batch, heads,
    width), out (batch, heads, head_dim). ``recurrent_forward`` runs it over a sequence;
    tests/test_recurrent.py and ``synthbench check`` prove it equals the causal ``forward``.
    """

    extra_inputs: dict[str, int] = {}  # never mutated; an instance may set its own
    # forward(causal=False) raises: a recurrence (a decay, a delta rule) has no two-sided form
    causal_only: ClassVar[bool] = False

    def __init__(self, head_dim: int, n_heads: int) -> None:
        super().__init__()
        self.head_dim, self.n_heads = head_dim, n_heads

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True
    ) -> torch.Tensor:
        raise NotImplementedError

    def set_max_len(self, max_len: int) -> None:
        """The model tells each of its mechanisms the longest sequence it will see (training
        and evaluation lengths); one whose parameters follow it (cosformer's horizon) keeps
        it. Optional for a plugin: the model calls it only where it exists."""

    def state_size(self, seq_len: int) -> int:
        """Numbers a head carries from one token to the next when generating causally.
        A quadratic mechanism keeps its keys and values (2 x L x d, as Zoology counts it)."""
        return 2 * seq_len * self.head_dim


class MatrixStateMechanism(Mechanism):
    """A causal-only recurrence whose state is one (head_dim x head_dim) matrix S per head,
    zero before the first token (retnet, gla, mamba2, deltanet): they differ in how S decays
    and is written, not in what it is."""

    causal_only = True

    def state_size(self, seq_len: int) -> int:
        """The d x d state S, whatever the length."""
        return self.head_dim * self.head_dim

    def initial_state(self, batch: int, device, dtype: torch.dtype) -> torch.Tensor:
        """S = 0: (batch, heads, head_dim, head_dim) in at least float32."""
        dtype = torch.promote_types(dtype, torch.float32)
        shape = (batch, self.n_heads, self.head_dim, self.head_dim)
        return torch.zeros(shape, device=device, dtype=dtype)


class FeatureMapMechanism(Mechanism):
    """Kernelised attention phi(q) phi(k)^T, normalised, on the shared linear core.

    Subclasses implement ``feature_map(x, is_query)`` returning features of shape
    (batch, heads, length, features) and ``feature_dim``. Features are non-negative unless
    the class sets ``signed = True``, which switches the core to its guarded denominator.

    Causal sequences no longer than ``feature_dim`` take an exact shortcut: the (L x L)
    scores, then the same normalisation (``attend_to_scores``). There the scores are
    smaller than the (features x head_dim) state of the core, and a mechanism whose kernel
    factorises overrides ``scores`` to compute them without forming the features at all.
    One that sets ``factored = True`` also gives ``score_factors`` (the same scores as
    thin differentiable factors, ``factored_scores``) and gets
    ``attend_to_factored_scores``: the same output from ``scores`` a block of batch rows at
    a time, never the (B, H, L, L) of the whole batch, recomputed from the factors in the
    backward. A mechanism with learnable parameters, or a call under a torch.func transform,
    takes the plain ``attend_to_scores`` instead (the blocked backward gives gradients to q,
    k and v only, and has no vmap rule).

    **Recurrent form.** Every subclass decodes token by token with the state (S, z),
    S = sum_j phi(k_j)^T v_j (batch, heads, features, head_dim) and z = sum_j phi(k_j)
    (batch, heads, features), in at least float32: out = phi(q) S / (phi(q) . z + eps), with
    the core's normalisation (``normalise``: the guarded denominator where ``signed``), so it
    equals the causal ``forward``. That holds only where a position's features depend on its
    own q or k alone: a subclass whose features depend on the position or on the sequence
    (its length, a statistic over it) overrides ``initial_state``/``step`` correctly
    (cosformer carries the position) or sets ``recurrent = False`` (then
    ``has_recurrent_form`` is False). ``synthbench check`` proves the form of every one.
    """

    signed: ClassVar[bool] = False
    recurrent: ClassVar[bool] = True  # False: features depend on the position or the sequence
    factored: ClassVar[bool] = False  # True: the short path goes through score_factors

    def __init__(self, head_dim: int, n_heads: int, eps: float = 1e-6, chunk_size: int = 64):
        super().__init__(head_dim, n_heads)
        if eps < 0 or chunk_size < 1:
            raise ValueError(f"eps must be >= 0 and chunk_size >= 1, got {eps}, {chunk_size}")
        self.eps, self.chunk_size = eps, chunk_size

    def feature_map(self, x: torch.Tensor, is_query: bool) -> torch.Tensor:
        raise NotImplementedError

    @property
    def feature_dim(self) -> int:
        """Number of features per position."""
        raise NotImplementedError

    def state_size(self, seq_len: int) -> int:
        """The running (features x d) state and the (features) normaliser, whatever L."""
        return self.feature_dim * (self.head_dim + 1)

    def scores(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """phi(q) phi(k)^T: (batch, heads, L, L) in at least float32."""
        phi_q, phi_k = self.feature_map(q, is_query=True), self.feature_map(k, is_query=False)
        dtype = compute_dtype(phi_q, phi_k)
        return phi_q.to(dtype) @ phi_k.to(dtype).mT

    def score_factors(self, q: torch.Tensor, k: torch.Tensor) -> list[tuple[torch.Tensor, int]]:
        """``scores`` as factors for ``factored_scores``: [(x, power)], x (2, batch, heads, L,
        K) stacking the query side and the key side. By default the features themselves."""
        phi_q, phi_k = self.feature_map(q, is_query=True), self.feature_map(k, is_query=False)
        dtype = compute_dtype(phi_q, phi_k)
        return [(torch.stack([phi_q.to(dtype), phi_k.to(dtype)]), 1)]

    def score_factors_vjp(self, q: torch.Tensor, k: torch.Tensor):
        """``score_factors`` with a hand-written backward: (factors, vjp), vjp(the factors'
        gradients) -> (dq, dk); None (the default) to let autograd differentiate them."""
        return None

    def forward(self, q, k, v, causal: bool = True):
        if causal and q.shape[-2] <= self.feature_dim:
            # the blocked path gives gradients to q, k and v only: learnable factors go plain
            learnable = any(t.requires_grad for t in self.parameters())
            if self.factored and not learnable and not functorch_active():
                return attend_to_factored_scores(
                    q,
                    k,
                    v,
                    self.scores,
                    self.score_factors,
                    self.eps,
                    self.signed,
                    factors_vjp=self.score_factors_vjp,
                )
            return attend_to_scores(self.scores(q, k), v, causal, self.eps, self.signed)
        phi_q, phi_k = self.feature_map(q, is_query=True), self.feature_map(k, is_query=False)
        return linear_attention(
            phi_q, phi_k, v, causal, eps=self.eps, chunk_size=self.chunk_size, signed=self.signed
        )

    def initial_state(self, batch: int, device, dtype: torch.dtype):
        """(S, z) of no token: zeros in at least float32 (as the core sums)."""
        dtype = torch.promote_types(dtype, torch.float32)
        features = self.feature_dim
        s = torch.zeros(batch, self.n_heads, features, self.head_dim, device=device, dtype=dtype)
        return s, torch.zeros(batch, self.n_heads, features, device=device, dtype=dtype)

    def step(self, state, q, k, v):
        """One position: its features, then ``step_features``."""
        phi_q = self.feature_map(q.unsqueeze(-2), is_query=True)
        phi_k = self.feature_map(k.unsqueeze(-2), is_query=False)
        return self.step_features(state, phi_q, phi_k, v)

    def step_features(self, state, phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor):
        """Add phi(k)^T v to S and phi(k) to z, then read them with phi(q): features
        (batch, heads, 1, features), v (batch, heads, head_dim) -> (out, (S, z)), out in v's
        dtype. Not in place: autograd sees every state."""
        s, z = state
        out_dtype, dtype = v.dtype, compute_dtype(phi_q, phi_k, v, s)
        phi_q, phi_k, v = phi_q.to(dtype), phi_k.to(dtype), v.to(dtype).unsqueeze(-2)
        s = s + phi_k.mT @ v  # (B, H, F, 1) @ (B, H, 1, D)
        z = z + phi_k.squeeze(-2)
        num = (phi_q @ s).squeeze(-2)  # (B, H, D)
        den = (phi_q.squeeze(-2) * z).sum(-1)  # (B, H)
        return normalise(num, den, self.eps, self.signed).to(out_dtype), (s, z)


def extra_inputs(mechanism: nn.Module) -> dict[str, int]:
    """The extra per-token inputs a mechanism reads (name -> width per head); {} for one
    that reads only q, k and v (every mechanism written before them, and most plugins)."""
    return dict(getattr(mechanism, "extra_inputs", None) or {})


def has_recurrent_form(mechanism: nn.Module) -> bool:
    """Whether ``mechanism`` decodes token by token: it has ``initial_state`` and ``step``
    and does not switch them off (``recurrent = False``, which a feature-map mechanism whose
    features depend on the position or the sequence sets)."""
    if getattr(mechanism, "recurrent", True) is False:
        return False
    return callable(getattr(mechanism, "step", None)) and callable(
        getattr(mechanism, "initial_state", None)
    )


def recurrent_forward(
    mechanism: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **extra
) -> torch.Tensor:
    """The causal output computed token by token through ``mechanism.step``: the reference
    the parallel form must equal (and how a decoder would run it)."""
    state = mechanism.initial_state(q.shape[0], q.device, q.dtype)
    outs = []
    for t in range(q.shape[-2]):
        at = {name: x[..., t, :] for name, x in extra.items()}
        out, state = mechanism.step(state, q[..., t, :], k[..., t, :], v[..., t, :], **at)
        outs.append(out)
    return torch.stack(outs, dim=-2)


def random_generator(seed: int | None) -> torch.Generator | None:
    """Where a mechanism draws its random features: seed None, torch's global RNG (the engine
    seeds it with the run's seed right before building the model, so a run is reproducible
    and each layer gets its own draw); an int, a private CPU generator seeded with it."""
    if seed is None:
        return None
    check_int("seed", seed, 0)
    return torch.Generator().manual_seed(seed)


def mechanism_params(cls: type[nn.Module], overrides: dict[str, Any] | None = None) -> dict:
    """The full parameter set of a mechanism: its constructor defaults with ``overrides``.

    Raises ValueError naming an unknown parameter, a wrong type or a missing value.
    """
    return constructor_params(f"mechanism {MECHANISMS.name_of(cls)}", cls, overrides)


MAX_MECHANISM_BYTES = 2**30  # parameters and buffers of one layer; built-ins hold kilobytes


@dataclass(frozen=True)
class Mixer:
    """What one model layer builds for a mechanism: its core ``cls(head_dim, n_heads,
    **params)``, or in the block track its published layer ``cls(d_model, n_heads,
    **params)`` (synthbench/core/layer.py); ``owner`` names it in messages."""

    cls: type[nn.Module]
    sizes: tuple[int, int]
    owner: str

    def params(self, overrides: dict[str, Any] | None = None) -> dict:
        """Its full parameters: the constructor's defaults with ``overrides``, checked."""
        if issubclass(self.cls, Layer):
            return layer_params(self.owner, self.cls, overrides)
        return constructor_params(self.owner, self.cls, overrides)

    def build(self, params: dict[str, Any]) -> nn.Module:
        return self.cls(*self.sizes, **params)


def mixer(name: str, d_model: int, n_heads: int, arch: str) -> Mixer:
    """The ``Mixer`` of mechanism ``name`` in a model of ``arch``: its published layer under
    ``arch=block`` (or ``block-conv``) where it has one (``layer_of``), its core otherwise."""
    entry = MECHANISMS.entry(name)
    layer = layer_of(entry.obj) if arch in LAYER_ARCHS else None
    if layer is not None:
        return Mixer(layer, (d_model, n_heads), f"layer {entry.name}")
    return Mixer(entry.obj, (d_model // n_heads, n_heads), f"mechanism {entry.name}")


def layer_state(
    name: str, d_model: int, n_heads: int, arch: str, params: dict[str, Any] | None, length: int
) -> int:
    """The numbers one model layer of mechanism ``name`` (``mixer``: its published layer, or
    its core) carries from one token to the next at ``length``: a layer's whole declared
    ``state_size``, a core's per-head one times the heads."""
    built = mixer(name, d_model, n_heads, arch)
    module = built.build(built.params(params))
    size = int(module.state_size(length))
    return size if isinstance(module, Layer) else size * n_heads


def build_once(name: str, head_dim: int, n_heads: int, params: dict[str, Any]) -> None:
    """Build mechanism ``name``'s core once (``build_mixer_once``)."""
    cls = MECHANISMS.get(name)
    build_mixer_once(Mixer(cls, (head_dim, n_heads), f"mechanism {name}"), params)


def build_mixer_once(mixer: Mixer, params: dict[str, Any]) -> None:
    """Build ``mixer`` once, so that a parameter value it rejects, a (plugin's) constructor
    that raises, or parameters too large for memory (``prf_features=10**8``) are a
    ValueError naming it before any work, not a traceback or the machine's memory."""
    name = mixer.owner
    try:
        with torch.device("meta"):  # the sizes without the memory
            module = mixer.build(params)
    except BaseException as exc:  # invalid values, or a constructor that needs real tensors
        caught(exc)  # (a .item()): the real build below says which
        module = None
    try:
        if module is None:
            module = mixer.build(params)
    except (TypeError, ValueError) as exc:  # the user's parameter values, most likely
        raise ValueError(f"{name}: {exc}") from exc
    except BaseException as exc:  # sys.exit() in a plugin's constructor too
        raise ValueError(f"{name} cannot be built: {describe(caught(exc))}") from exc
    size = sum(t.numel() * t.element_size() for t in (*module.parameters(), *module.buffers()))
    if size > MAX_MECHANISM_BYTES:
        values = ", ".join(f"{k}={v}" for k, v in params.items())
        raise ValueError(
            f"{name} ({values}) holds {size / 2**30:,.1f} GiB of parameters and "
            f"buffers per layer, more than the {MAX_MECHANISM_BYTES / 2**30:g} GiB synthbench "
            "allows"
        )


STATE_LENGTH, STATE_HEAD_DIM = 1024, 16  # where `list mechs` and the docs quote state sizes


def state_size_at_defaults(cls: type[nn.Module]) -> int:
    """The per-head state of a mechanism at its default parameters, L 1024 and d 16."""
    return cls(STATE_HEAD_DIM, 4).state_size(STATE_LENGTH)


def markdown_table() -> str:
    """The built-in mechanisms (docs/MECHANISMS.md embeds this; a test checks it)."""
    lines = [
        f"| name | aliases | complexity | family | state per head (L {STATE_LENGTH}, "
        f"d {STATE_HEAD_DIM}) | scores >= 0 guaranteed | reference |",
        "|---|---|---|---|---|---|---|",
    ]
    for e in sorted(MECHANISMS.entries(), key=lambda e: e.name):
        if e.source != "builtin":
            continue
        if not getattr(e.obj, "has_scores", True):
            non_negative = "-"
        elif getattr(e.obj, "signed", False):
            non_negative = "no (signed features)"
        else:
            non_negative = "yes"
        lines.append(
            f"| `{e.name}` | {', '.join(e.aliases)} | {e.metadata['complexity']} | "
            f"{e.metadata['family']} | {state_size_at_defaults(e.obj):,} | {non_negative} | "
            f"{e.metadata['reference']} |"
        )
    return "\n".join(lines) + "\n"
