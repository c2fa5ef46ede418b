"""The model that isolates the attention mechanism.

``attn-only`` (default, as in the SLAY task suite): token embedding + positional embedding,
then n_layers x (multi-head attention + residual), then a linear head; no MLP, no norm, so
every bit of token mixing is the mechanism's. ``attn-conv``: attn-only with a short causal
convolution on q, k and v before the mechanism (depthwise, ``SHORT_CONV`` positions, then
SiLU), as flash-linear-attention's DeltaNet, GLA and Based layers have: each position's
q, k and v also see the few tokens before it, whatever the mechanism. ``transformer``:
pre-norm blocks with an MLP and a final LayerNorm. The mechanism only ever sees (batch,
heads, length, head_dim).

``block`` (the block track): flash-linear-attention's block, the same for every mechanism,
with the mechanism's published layer as its mixer (synthbench/core/layer.py); a mechanism
without one enters as its core inside the plain multi-head projections. Each part as fla
builds it (fla/models/gated_deltanet/modeling_gated_deltanet.py; GLA's, DeltaNet's and
RetNet's models are the same): an RMSNorm before the mixer (``attn_norm``) and before the
MLP (``mlp_norm``), a final RMSNorm before the head (``GatedDeltaNetModel.norm``), fla's gated
MLP (``GatedMLP``, fla/modules/mlp.py) and fla's initialisation (``fla_init``). No biases
outside the mixer: fla's MLP and head have none.

``block-plain``: the block track's block before recipe v2 (protocols quick-block v3 and
older): the mixer unnormalised, an MLP of LayerNorm, Linear, GELU, Linear, no final norm,
PyTorch's default initialisation. Kept as an option (docs/MECHANISMS.md, "The block track's
block", says what it changes). ``block-conv``: the block track with Zoology's "Based recipe",
every mechanism paired with a gated short convolution: layer i is a ``BaseConv`` block for
even i, the mechanism's for odd i (so it needs n_layers >= 2).

Positions: an absolute embedding added to the tokens (``learned``, ``sinusoidal``), nothing
(``none``), or a rotation of each head's queries and keys by position (the ``ROTATIONS`` of
synthbench/core/positional.py), in which case nothing is added to the tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from synthbench.core.layer import LAYER_ARCHS, BaseConv, Layer, RMSNorm
from synthbench.core.mechanism import extra_inputs
from synthbench.core.params import check_int, constructor_params
from synthbench.core.positional import ROTATIONS
from synthbench.core.text import did_you_mean

ARCHS = ("attn-only", "attn-conv", "transformer", *LAYER_ARCHS)
TRACKS = {"core": "attn-only", "block": "block"}  # a track: the arch its protocols use
FLA_ARCHS = ("block", "block-conv")  # fla's block: its norms, gated MLP and initialisation
SHORT_CONV = 4  # attn-conv's kernel: flash-linear-attention's default conv_size
ABSOLUTE_POSITIONS = ("learned", "sinusoidal", "none")
POSITIONS = (*ABSOLUTE_POSITIONS, *ROTATIONS)


def check_position(pos: str) -> None:
    """Raise ValueError for an unknown positional encoding, naming the close matches."""
    if pos not in POSITIONS:
        raise ValueError(
            f"unknown positional encoding '{pos}'{did_you_mean(pos, POSITIONS)} "
            f"(known: {', '.join(POSITIONS)})"
        )


def position_params(pos: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The complete parameters of positional encoding ``pos``: a rotation's constructor
    defaults updated with ``overrides``; {} for the absolute encodings, which take none."""
    check_position(pos)
    if pos not in ROTATIONS:
        if overrides:
            raise ValueError(
                f"pos {pos} has no parameters (only the rotations {', '.join(ROTATIONS)} do)"
            )
        return {}
    return constructor_params(f"pos {pos}", ROTATIONS[pos], overrides)


def make_rotation(
    pos: str, head_dim: int, n_heads: int, params: dict[str, Any]
) -> nn.Module | None:
    """The rotation of ``pos`` for one layer, or None for an absolute encoding; an invalid
    parameter raises a ValueError that names the pos."""
    if pos not in ROTATIONS:
        return None
    try:
        return ROTATIONS[pos](head_dim, n_heads, **params)
    except ValueError as exc:
        raise ValueError(f"pos {pos}: {exc}") from exc


def check_model_dimensions(
    vocab_size: int, max_len: int, d_model: int, n_heads: int, n_layers: int
) -> None:
    """Raise ValueError naming the first size that is not an integer >= 1, or d_model not
    divisible by n_heads: a model of width 0 would train, on nothing, and n_heads = 0 would
    divide by zero. (A protocol refuses its own values earlier, listing every problem.)"""
    sizes = {"vocab_size": vocab_size, "max_len": max_len, "d_model": d_model,
             "n_heads": n_heads, "n_layers": n_layers}  # fmt: skip
    for name, value in sizes.items():
        check_int(name, value, 1)
    if d_model % n_heads:
        raise ValueError(f"d_model must be divisible by n_heads, got {d_model} and {n_heads}")


def sinusoidal_positions(max_len: int, d_model: int) -> torch.Tensor:
    position = torch.arange(max_len, dtype=torch.float32).unsqueeze(1)
    freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(1e4) / d_model))
    table = torch.zeros(max_len, d_model)
    table[:, 0::2] = torch.sin(position * freq)
    table[:, 1::2] = torch.cos(position * freq)[:, : d_model // 2]
    return table


class MultiHeadAttention(nn.Module):
    def __init__(
        self,
        d_model: int,
        n_heads: int,
        mechanism: nn.Module,
        rotation: nn.Module | None = None,
        short_conv: int = 0,
    ) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        # attn-conv: a depthwise causal convolution over the last ``short_conv`` positions
        self.conv = (
            nn.Conv1d(3 * d_model, 3 * d_model, short_conv, groups=3 * d_model)
            if short_conv
            else None
        )
        self.out = nn.Linear(d_model, d_model)
        self.mechanism = mechanism
        self.rotation = rotation
        # a gate, a decay, a write strength per token (Mechanism.extra_inputs): one more
        # projection, only for a mechanism that asks (the others' parameters are unchanged)
        self.extra_widths = extra_inputs(mechanism)
        if self.extra_widths:
            self.extra = nn.Linear(d_model, n_heads * sum(self.extra_widths.values()))

    def forward(self, x: torch.Tensor, causal: bool = True) -> torch.Tensor:
        B, L, D = x.shape
        qkv = self.qkv(x)
        if self.conv is not None:  # padded on the left only: i sees i - kernel + 1 .. i
            window = F.pad(qkv.transpose(1, 2), (self.conv.kernel_size[0] - 1, 0))
            qkv = F.silu(self.conv(window)).transpose(1, 2)
        qkv = qkv.view(B, L, 3, self.n_heads, D // self.n_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv
        if self.rotation is not None:  # positions enter through q and k only, never v
            q, k = self.rotation(qkv[:2])  # both in one call: one set of angles
        extra = {}
        if self.extra_widths:
            projected = self.extra(x).view(B, L, self.n_heads, -1).transpose(1, 2)
            parts = projected.split(list(self.extra_widths.values()), dim=-1)
            extra = dict(zip(self.extra_widths, parts, strict=True))
        y = self.mechanism(q, k, v, causal=causal, **extra)  # (B, H, L, head_dim)
        return self.out(y.transpose(1, 2).reshape(B, L, D))


# fla's norm epsilon (GatedDeltaNetConfig, GLAConfig: norm_eps=1e-6) and initialiser range
FLA_NORM_EPS = 1e-6
FLA_INIT_STD = 0.02


class GatedMLP(nn.Module):
    """fla's ``GatedMLP`` (fla/modules/mlp.py) with its defaults, ``hidden_ratio`` 4 and
    ``hidden_act`` swish: down(silu(gate(x)) * up(x)), no biases, the hidden width 2/3 of
    4 x d_model rounded up to a multiple of 256 (so that its three matrices hold as many
    numbers as a 4x MLP's two would)."""

    def __init__(self, d_model: int, hidden_ratio: int = 4) -> None:
        super().__init__()
        hidden = int(d_model * hidden_ratio * 2 / 3)
        hidden = 256 * ((hidden + 255) // 256)
        self.gate_proj = nn.Linear(d_model, hidden, bias=False)
        self.up_proj = nn.Linear(d_model, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def fla_init(model: nn.Module, std: float = FLA_INIT_STD) -> None:
    """fla's ``_init_weights`` (fla/models/gated_deltanet/modeling_gated_deltanet.py, and the
    same in its GLA, DeltaNet, RetNet and Transformer models) with its default
    ``prenorm_residual_strategy=None``: every Linear and Conv1d weight (the layers' own
    projections and short convolutions too) drawn from N(0, std), their biases zero, every
    Embedding from N(0, std). Norms keep their ones; a layer's own parameters (Mamba-2's
    A_log, dt_bias and D, decays) keep the initialisation their sources give them."""
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Conv1d, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)


class Block(nn.Module):
    """One residual block of ``arch`` around a mixer: the mechanism's published layer, or its
    core in plain multi-head projections (the module docstring describes each arch)."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        mechanism: nn.Module,
        arch: str,
        rotation: nn.Module | None = None,
    ) -> None:
        super().__init__()
        short_conv = SHORT_CONV if arch == "attn-conv" else 0
        if isinstance(mechanism, Layer):  # the block track's published layer: a whole mixer
            if arch not in LAYER_ARCHS:
                raise ValueError(f"a published layer belongs in arch=block, not {arch}")
            self.attn = mechanism
        else:
            self.attn = MultiHeadAttention(d_model, n_heads, mechanism, rotation, short_conv)
        self.has_mlp = arch != "attn-only" and arch != "attn-conv"
        if arch in FLA_ARCHS:  # fla's: RMSNorm before the mixer and the MLP
            self.norm1 = RMSNorm(d_model, FLA_NORM_EPS)
            self.norm2 = RMSNorm(d_model, FLA_NORM_EPS)
            self.mlp = GatedMLP(d_model)
        elif self.has_mlp:  # transformer: LayerNorm before both; block-plain: before the MLP
            self.norm1 = nn.Identity() if arch == "block-plain" else nn.LayerNorm(d_model)
            self.norm2 = nn.LayerNorm(d_model)
            self.mlp = nn.Sequential(
                nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model)
            )

    def forward(self, x: torch.Tensor, causal: bool) -> torch.Tensor:
        if not self.has_mlp:
            return x + self.attn(x, causal)
        x = x + self.attn(self.norm1(x), causal)
        return x + self.mlp(self.norm2(x))


class Model(nn.Module):
    def __init__(
        self,
        vocab_size: int,
        max_len: int,
        mechanism: Callable[[], nn.Module],  # one layer's core, or its published Layer
        d_model: int = 64,
        n_heads: int = 4,
        n_layers: int = 2,
        arch: str = "attn-only",
        pos: str = "learned",
        pos_params: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if arch not in ARCHS:
            raise ValueError(
                f"unknown arch {arch!r}{did_you_mean(arch, ARCHS)} ({', '.join(ARCHS)})"
            )
        check_model_dimensions(vocab_size, max_len, d_model, n_heads, n_layers)
        pos_params = position_params(pos, pos_params)
        head_dim = d_model // n_heads
        self.max_len, self.pos = max_len, pos
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        if pos == "learned":
            self.pos_emb = nn.Embedding(max_len, d_model)
        elif pos == "sinusoidal":
            self.register_buffer(
                "pos_table", sinusoidal_positions(max_len, d_model), persistent=False
            )
        if arch == "block-conv" and n_layers < 2:
            raise ValueError("arch=block-conv needs n_layers >= 2 (even layers are BaseConv)")
        self.blocks = nn.ModuleList(
            # each layer its own rotation: learned frequencies and bases are per layer
            Block(
                d_model,
                n_heads,
                BaseConv(d_model)
                if arch == "block-conv" and i % 2 == 0
                else prepared_mechanism(mechanism, max_len),
                arch,
                make_rotation(pos, head_dim, n_heads, pos_params),
            )
            for i in range(n_layers)
        )
        # a final norm before the head: the transformer's LayerNorm, fla's RMSNorm
        self.norm = nn.Identity()
        if arch == "transformer":
            self.norm = nn.LayerNorm(d_model)
        elif arch in FLA_ARCHS:
            self.norm = RMSNorm(d_model, FLA_NORM_EPS)
        self.head = nn.Linear(d_model, vocab_size, bias=arch not in FLA_ARCHS)
        if arch in FLA_ARCHS:
            fla_init(self)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (B, L) int64 -> what enters the first block (B, L, d_model): the token
        embeddings plus the absolute positions, if any."""
        L = tokens.shape[1]
        if L > self.max_len:
            raise ValueError(f"sequence of length {L} exceeds the model's max_len {self.max_len}")
        x = self.tok_emb(tokens)
        if self.pos == "learned":
            x = x + self.pos_emb(torch.arange(L, device=tokens.device))
        elif self.pos == "sinusoidal":
            x = x + self.pos_table[:L]
        return x

    def from_embeddings(self, x: torch.Tensor, causal: bool = True) -> torch.Tensor:
        """The blocks and the head: ``embed``'s output (B, L, d_model) -> logits (B, L,
        vocab). Apart so that the causality check (synthbench/integrity/causality.py) can
        differentiate the logits with respect to every position's input."""
        for block in self.blocks:
            x = block(x, causal)
        return self.head(self.norm(x))

    def forward(self, tokens: torch.Tensor, causal: bool = True) -> torch.Tensor:
        """tokens (B, L) int64 -> logits (B, L, vocab)."""
        return self.from_embeddings(self.embed(tokens), causal)


def prepared_mechanism(make: Callable[[], nn.Module], max_len: int) -> nn.Module:
    """A new mechanism from ``make``, told the longest sequence it will see, as a model
    builds each of its layers' (``set_max_len`` is optional for a plugin:
    synthbench/core/mechanism.py)."""
    mechanism = make()
    if hasattr(mechanism, "set_max_len"):
        mechanism.set_max_len(max_len)
    return mechanism
