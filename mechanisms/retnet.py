"""Retention (Sun et al. 2023, Retentive Network: A Successor to Transformer for Large
Language Models, arXiv 2307.08621, sec. 2.1-2.2), the bare retention of each head.

For head h = 0 .. H-1 (H = n_heads) with the fixed decay

    gamma_h = 1 - 2^(-5 - h)        (the paper's multi-scale choice, sec. 2.2:
                                     gamma = 1 - 2^(-5 - arange(0, h)); 31/32, 63/64, ...)

and d = head_dim, the output at position t is

    o_t = sum_{s <= t} gamma_h^(t - s) (q_t . k_s / sqrt(d)) v_s,

that is, q scaled by d^(-1/2) (the paper's first normalisation factor, Q K^T / sqrt(d); its
code scales k instead, the same product). The sum is not normalised: no softmax, no
denominator. Recurrent form: S_t = gamma_h S_{t-1} + k_t^T v_t (a d x d state, S_{-1} = 0),
o_t = (q_t / sqrt(d)) S_t.

Left to the model in the ``core`` track (they belong to the model there, or need a part it
lacks); the whole published layer, with all of them, is ``RetNetLayer`` below (the ``block``
track; section "The published layer"):

- xPos, the relative-position rotation the paper multiplies into Q and K (Theta, Theta-bar):
  in the core track positions are the model's (``--pos``, docs/POSITIONS.md).
- GroupNorm of each head's output, the swish gate and the output projection W_O of gated
  multi-scale retention: in the core track the model's output projection follows the
  mechanism as for every other one.
- The paper's second and third normalisation factors (the decay mask divided by the square
  root of its row sums, the scores divided by max(|row sum|, 1)): they are harmless there only
  because the GroupNorm that follows cancels any per-row scale; without it they would change
  the function. The layer leaves them out too (its per-head norm cancels them but for eps).

The decays are a buffer ``log_decay`` = log(gamma_h) = log1p(-2^(-5 - h)), not learned,
float64 as built (a module's ``.to(dtype)`` casts it). Logarithms, so that gamma_h stays
below 1 in float32 for every head: from head 20 on, 1 - 2^(-5 - h) rounds to 1 in float32,
its logarithm does not round to 0.

Three forms of the same function:

- ``retention_reference``: the parallel representation (paper sec. 2.1),
  ((Q K^T / sqrt(d)) * D) V, * elementwise, with the (L x L) decay mask
  D_ts = gamma^(t - s) for s <= t, 0 otherwise.
- ``chunked_retention`` (``forward``): the chunkwise recurrent representation (sec. 2.1)
  in chunks of ``chunk_size``: inside a chunk the masked decayed scores; across chunks the
  d x d state S of every earlier chunk, decayed. Cost O(L (C + d) d) for chunks of C; no L x L
  matrix.
- the recurrent form (``initial_state``, ``step``), d x d numbers per head whatever the
  length.

The published layer (``RetNetLayer``, ``Retention.layer``): gated multi-scale retention,
paper sec. 2.2 eq. (8), MSR(X) = (swish(X W_G) * GroupNorm_h(Concat_h Retention(X,
gamma_h))) W_O, as the authors' code writes it (microsoft/torchscale, torchscale/component/
multiscale_retention.py and architecture/retnet.py ``RetNetRelPos``, first release bf65397),
from x (batch, length, d_model), in this order:

- Q = X W_Q, K = X W_K (width key_dim = int(d_model * expand_k), expand_k 1, the paper's
  d_model) and V = X W_V (value_dim = int(d_model * expand_v), expand_v 2: the paper's
  2 d_model values, sec. 3.1; torchscale ``value_factor=2``, fla ``expand_v=2``), Linear
  without bias (torchscale since 5c89ffb, fla); heads of d_k = key_dim / H, d_v = value_dim / H;
- xPos, the rotation Theta_n = e^(i n theta) of eq. (3)-(5) on Q and K (the decay gamma takes
  the place of xPos's scale): channel pairs (2j, 2j + 1) of each head turn by n theta_j at
  position n = 0, 1, ..., theta_j = 10000^(-j / (d_k/2 - 1)) (torchscale ``RetNetRelPos``:
  ``1 / 10000 ** linspace(0, 1, d_k // 2)``, ``rotate_every_two``);
- retention per head with the fixed gamma_h = 1 - 2^(-5 - h) (eq. (8); torchscale's
  ``decay = log(1 - 2 ** (-5 - arange(heads)))``, a buffer, not learned), q . k scaled by
  d_k^(-1/2): ``chunked_retention`` above (the recurrent form: the core's ``step``);
- ``norm='group'`` (default): GroupNorm with one group per head, no affine, eps ``norm_eps``
  1e-5 (eq. (8); torchscale's first release: ``LayerNorm(head_dim, elementwise_affine=False)``
  per head, eps ``layernorm_eps`` 1e-5); ``norm='rms'``: RMS norm per head without affine
  (torchscale since 5c89ffb);
- with ``use_output_gate`` (default True): times swish(X W_G), W_G d_model -> value_dim, no
  bias (eq. (8)); without it the normalised heads go straight on (an ablation of ours: fla's
  no-gate path is an RMSNorm with a learned weight);
- the output projection W_O (value_dim -> d_model, no bias).

Not taken: torchscale's init (xavier_uniform, gain 2^-2.5; 2^-1 for W_O) -- every Linear here
keeps PyTorch's default, the same for every layer of the block track; fla's RMSNorm-gated
output norm with a learned scale and its rotary (half-split pairs, theta_j = 10000^(-2j/d_k))
-- this layer follows the paper and its authors' code; fla's short convolution, feature map and
kv-head options (off by default there). No single torchscale commit is this default: its
norm (LayerNorm per head, no affine) is the first release's, whose five Linear layers had
biases; the bias-free projections are those of 5c89ffb on, where the norm became an RMSNorm
with eps 1e-6 (``norm='rms'`` here keeps 1e-5; fla's RetNetConfig passes 1e-6 too). The
recurrent state carries S (H x d_k x d_v) and the position index n, for the rotation of the
next token.

Numerics: every decay is a power gamma^e with e >= 0, computed as exp(e log gamma), in (0, 1]:
never gamma^(-t), which overflows for long sequences (the form that divides the state by
gamma^t). Sums run in at least float32 (``compute_dtype``); the output comes back in v's
dtype. Causal only: retention has no non-causal form in the paper.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from synthbench.core.layer import Layer, rms_normalise
from synthbench.core.linear_attention import chunking, compute_dtype
from synthbench.core.mechanism import MECHANISMS, MatrixStateMechanism
from synthbench.core.params import check_int, check_positive


def retention_log_decays(n_heads: int) -> torch.Tensor:
    """log(gamma_h) = log1p(-2^(-5 - h)) for h = 0 .. n_heads - 1, float64."""
    values = [math.log1p(-(2.0 ** (-5 - h))) for h in range(n_heads)]
    return torch.tensor(values, dtype=torch.float64)


def _decay_powers(exponent: torch.Tensor, log_decay: torch.Tensor) -> torch.Tensor:
    """gamma_h^e for every head: exponent (...) >= 0, log_decay (H,) -> (H, ...)."""
    shape = (-1,) + (1,) * exponent.dim()
    return torch.exp(exponent.to(log_decay.dtype) * log_decay.view(shape))


def _causal_decay_mask(length: int, log_decay: torch.Tensor) -> torch.Tensor:
    """D (H, length, length): D_ts = gamma_h^(t - s) for s <= t, else 0."""
    positions = torch.arange(length, device=log_decay.device)
    distance = positions[:, None] - positions[None, :]  # t - s
    return _decay_powers(distance.clamp(min=0), log_decay) * (distance >= 0)


def _check_causal(causal: bool) -> None:
    if not causal:
        raise ValueError(
            "retnet is causal only: retention (Sun et al. 2023) has no non-causal form"
        )


def retention_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor
) -> torch.Tensor:
    """The parallel representation: ((Q K^T / sqrt(d)) * D) V, * elementwise, with D the
    (L x L) decay mask, D_ts = gamma_h^(t - s) for s <= t, else 0."""
    dtype = compute_dtype(q, k, v)
    mask = _causal_decay_mask(q.shape[-2], log_decay.to(dtype))  # (H, L, L)
    scores = q.to(dtype) @ k.to(dtype).mT / math.sqrt(q.shape[-1])
    return ((scores * mask) @ v.to(dtype)).to(v.dtype)


def chunked_retention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_decay: torch.Tensor,
    chunk_size: int = 64,
) -> torch.Tensor:
    """The chunkwise recurrent representation: q, k (B, H, L, d) and v (B, H, L, d_v) ->
    (B, H, L, d_v) (d_v = d in the core; the published layer's values are wider).

    N = ceil(L / chunk_size) chunks of C = ceil(L / N) positions (the last one zero-padded:
    zero keys and values add nothing). For t = nC + a (a = 0 .. C-1) and S_n the recurrent
    state after position nC - 1 (the decayed sum over every earlier chunk):

        o_t     = sum_{b <= a} gamma^(a - b) (q_t . k_{nC+b}) v_{nC+b} + gamma^(a + 1) q_t S_n
        S_{n+1} = gamma^C S_n + sum_b gamma^(C - 1 - b) k_{nC+b}^T v_{nC+b}

    with q already scaled by d^(-1/2). The in-chunk terms and the per-chunk writes are
    computed for all chunks at once; only the d x d state recurrence loops over the chunks."""
    batch, heads, length, dim = q.shape
    out_dtype = v.dtype
    dtype = compute_dtype(q, k, v)
    log_decay = log_decay.to(dtype)
    N, C = chunking(length, chunk_size)
    pad = N * C - length
    q = q.to(dtype) / math.sqrt(dim)
    q, k, v = (
        F.pad(t.to(dtype), (0, 0, 0, pad)).reshape(batch, heads, N, C, t.shape[-1])
        for t in (q, k, v)
    )

    # inside each chunk: ((q k^T) * D) v, * elementwise, D (H, C, C) broadcast over batch
    # and chunks
    inside = _causal_decay_mask(C, log_decay).unsqueeze(1)  # (H, 1, C, C)
    out = ((q @ k.mT) * inside) @ v  # (B, H, N, C, d)
    if N > 1:
        a = torch.arange(C, device=q.device)
        to_end = _decay_powers(C - 1 - a, log_decay)  # (H, C): gamma^(C - 1 - b)
        from_start = _decay_powers(a + 1, log_decay)  # (H, C): gamma^(a + 1)
        per_chunk = torch.exp(C * log_decay).view(1, heads, 1, 1)  # gamma^C
        writes = k.mT @ (v * to_end[:, None, :, None])  # (B, H, N, d, d_v)
        states = [writes.new_zeros(writes.shape[:2] + writes.shape[3:])]
        for n in range(N - 1):
            states.append(per_chunk * states[-1] + writes[:, :, n])
        before = torch.stack(states, dim=2)  # (B, H, N, d, d_v): S_n, the state before chunk n
        out = out + (q * from_start[:, None, :, None]) @ before
    return out.reshape(batch, heads, N * C, -1)[:, :, :length].to(out_dtype)


@MECHANISMS.register(
    "retnet",
    aliases=("retention",),
    complexity="linear",
    family="retention",
    reference="Sun et al. 2023, Retentive Network (arXiv 2307.08621; retention only)",
)
class Retention(MatrixStateMechanism):
    """o_t = sum_{s <= t} gamma_h^(t - s) (q_t . k_s / sqrt(head_dim)) v_s with the fixed
    per-head decays gamma_h = 1 - 2^(-5 - h), h = 0 .. n_heads - 1 (buffer ``log_decay``,
    not learned); no xPos, GroupNorm or gate. Causal only (causal=False raises ValueError).
    The exact definition, what is left out and the numerics: the module docstring.

    chunk_size: positions per chunk of the chunkwise form (>= 1, default 64; any value gives
    the same function)."""

    signed = True  # its scores q.k gamma^(t-s) take either sign (nothing normalises them)

    def __init__(self, head_dim: int, n_heads: int, chunk_size: int = 64):
        super().__init__(head_dim, n_heads)
        check_int("chunk_size", chunk_size, 1)
        self.chunk_size = chunk_size
        self.register_buffer("log_decay", retention_log_decays(n_heads))

    @property
    def gamma(self) -> torch.Tensor:
        """The decays gamma_h (H,), from the buffer."""
        return self.log_decay.exp()

    def forward(self, q, k, v, causal: bool = True):
        _check_causal(causal)
        return chunked_retention(q, k, v, self.log_decay, self.chunk_size)

    def step(self, state, q, k, v):
        """S = gamma S + k^T v, then o = (q / sqrt(d)) S; q, k, v (batch, heads, head_dim).
        Not in place: autograd sees every state."""
        out_dtype = v.dtype
        dtype = compute_dtype(q, k, v, state)
        q, k, v = (t.to(dtype) for t in (q, k, v))
        gamma = self.log_decay.to(dtype).exp().view(1, -1, 1, 1)
        state = gamma * state + k.unsqueeze(-1) * v.unsqueeze(-2)  # + the outer product k^T v
        out = (q.unsqueeze(-2) / math.sqrt(self.head_dim) @ state).squeeze(-2)
        return out.to(out_dtype), state


ROTATION_BASE = 10000.0  # xPos / rotary base of torchscale's RetNetRelPos


def rotation_rates(head_k: int, device=None, dtype=torch.float64) -> torch.Tensor:
    """theta_j = 1 / 10000^(j / (d_k/2 - 1)), j = 0 .. d_k/2 - 1 (torchscale's RetNetRelPos:
    ``1 / 10000 ** linspace(0, 1, d_k // 2)``): the angle per position of channel pair j."""
    exponents = torch.linspace(0, 1, head_k // 2, device=device, dtype=dtype)
    return ROTATION_BASE**-exponents


def rotate_pairs(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Turn each channel pair (x_2j, x_2j+1) of x (..., d_k) by angles (broadcast to
    (..., d_k/2)): (a, b) -> (a cos - b sin, b cos + a sin), torchscale's ``theta_shift``."""
    a, b = x[..., 0::2], x[..., 1::2]
    cos, sin = angles.cos(), angles.sin()
    return torch.stack((a * cos - b * sin, b * cos + a * sin), dim=-1).flatten(-2)


class RetNetLayer(Layer):
    """The published RetNet layer, gated multi-scale retention (module docstring, "The
    published layer"): x (batch, length, d_model) -> the same shape, causal only.

    Options: expand_k 1 and expand_v 2 (key and value widths as multiples of d_model; each a
    whole multiple of n_heads, d_k even for the rotation), use_output_gate True (the swish
    gate), norm 'group' (the paper's GroupNorm per head) or 'rms', norm_eps 1e-5, chunk_size 64
    (of ``chunked_retention``; any value gives the same function)."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        expand_k: float = 1.0,
        expand_v: float = 2.0,
        use_output_gate: bool = True,
        norm: str = "group",
        norm_eps: float = 1e-5,
        chunk_size: int = 64,
    ):
        super().__init__(d_model, n_heads)
        check_positive(expand_k=expand_k, expand_v=expand_v, norm_eps=norm_eps)
        if not isinstance(use_output_gate, bool):
            raise ValueError(f"use_output_gate must be true or false, got {use_output_gate!r}")
        if norm not in ("group", "rms"):
            raise ValueError(f"norm must be 'group' or 'rms', got {norm!r}")
        key_dim, value_dim = int(d_model * expand_k), int(d_model * expand_v)
        for name, width in (("expand_k", key_dim), ("expand_v", value_dim)):
            if width < n_heads or width % n_heads:
                raise ValueError(
                    f"{name}: int(d_model * {name}) = {width} must be a positive multiple of "
                    f"n_heads {n_heads}"
                )
        if (key_dim // n_heads) % 2:
            raise ValueError(f"expand_k: the key head size {key_dim // n_heads} must be even")
        # the mixing, with the decays gamma_h (buffer log_decay); it checks chunk_size
        self.core = Retention(key_dim // n_heads, n_heads, chunk_size)
        self.key_dim, self.value_dim = key_dim, value_dim
        self.head_k, self.head_v = key_dim // n_heads, value_dim // n_heads
        self.use_output_gate, self.norm, self.norm_eps = use_output_gate, norm, norm_eps
        self.q_proj = nn.Linear(d_model, key_dim, bias=False)
        self.k_proj = nn.Linear(d_model, key_dim, bias=False)
        self.v_proj = nn.Linear(d_model, value_dim, bias=False)
        if use_output_gate:
            self.g_proj = nn.Linear(d_model, value_dim, bias=False)
        self.o_proj = nn.Linear(value_dim, d_model, bias=False)

    def _rotated_heads(self, t: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """t (..., key_dim) -> (..., n_heads, d_k) turned by xPos at ``positions``, whose
        shape is t's leading dimensions (the same angle for every head)."""
        dtype = torch.promote_types(t.dtype, torch.float32)
        rates = rotation_rates(self.head_k, t.device, dtype)
        angles = (positions.to(dtype).unsqueeze(-1) * rates).unsqueeze(-2)  # (..., 1, d_k/2)
        return rotate_pairs(t.unflatten(-1, (self.n_heads, self.head_k)).to(dtype), angles).to(
            t.dtype
        )

    def _head_norm(self, o: torch.Tensor) -> torch.Tensor:
        """Normalise each head's d_v outputs, o (..., n_heads, d_v): GroupNorm (mean and
        variance, no affine) or RMS norm, in at least float32."""
        if self.norm == "rms":
            return rms_normalise(o, self.norm_eps)
        o32 = o.to(torch.promote_types(o.dtype, torch.float32))
        centred = o32 - o32.mean(-1, keepdim=True)
        variance = centred.pow(2).mean(-1, keepdim=True)
        return (centred * torch.rsqrt(variance + self.norm_eps)).to(o.dtype)

    def _output(self, o: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Per-head norm, swish gate and W_O: o (..., n_heads, d_v), x (..., d_model)."""
        y = self._head_norm(o).flatten(-2)
        if self.use_output_gate:
            y = F.silu(self.g_proj(x)) * y
        return self.o_proj(y)

    def forward(self, x: torch.Tensor, causal: bool = True) -> torch.Tensor:
        self.check_causal(causal)
        positions = torch.arange(x.shape[1], device=x.device).expand(x.shape[:2])
        q = self._rotated_heads(self.q_proj(x), positions).transpose(1, 2)  # (B, H, L, d_k)
        k = self._rotated_heads(self.k_proj(x), positions).transpose(1, 2)
        v = self.v_proj(x).unflatten(-1, (self.n_heads, self.head_v)).transpose(1, 2)
        o = self.core(q, k, v)  # chunked_retention: (B, H, L, d_v)
        return self._output(o.transpose(1, 2), x)

    def initial_state(self, batch: int, device, dtype: torch.dtype) -> dict:
        """S (batch, n_heads, d_k, d_v) zeros in at least float32 (as the core's) and the
        position n of the next token, 0 (batch,) int64."""
        s_dtype = torch.promote_types(dtype, torch.float32)
        shape = (batch, self.n_heads, self.head_k, self.head_v)
        return {
            "S": torch.zeros(shape, device=device, dtype=s_dtype),
            "position": torch.zeros(batch, device=device, dtype=torch.long),
        }

    def step(self, state: dict, x: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """One position: x (batch, d_model) -> (y (batch, d_model), the new state)."""
        position = state["position"]
        q = self._rotated_heads(self.q_proj(x), position)
        k = self._rotated_heads(self.k_proj(x), position)
        v = self.v_proj(x).unflatten(-1, (self.n_heads, self.head_v))
        o, S = self.core.step(state["S"], q, k, v)
        return self._output(o, x), {"S": S, "position": position + 1}

    def state_size(self, seq_len: int) -> int:
        """S (n_heads d_k d_v) and the position index."""
        return self.n_heads * self.head_k * self.head_v + 1


Retention.layer = RetNetLayer
