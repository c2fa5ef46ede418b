"""H3: a time-invariant gated convolution (Fu, Dao, Saab, Thomas, Rudra and Re 2023, Hungry
Hungry Hippos, arXiv 2212.14052, sec. 3.2), one of the gated convolutions that Zoology (Arora
et al. 2023, arXiv 2312.04927, Fig. 2) finds to recall less than attention on multi-query
associative recall (MQAR).

Per head, the d = head_dim channels of q, k and v split into G = d / e groups of e channels
(e = ``group_size``, the code's ``head_dim``). With N = d_state, for every group g:

    kbar_t = sum_{l=0}^{N-1} W_l k_{t-l} + D_k k_t     the shift SSM: an N-tap causal filter
                                                        per channel, with its own D skip
    u_t    = kbar_t (x) v_t                             e x e numbers (an outer product)
    y      = S4D_g(u)                                   a diagonal SSM with its D skip, the same
                                                        kernel for all e x e channels of g
    out_t[j] = sum_i q_t[i] y_t[i, j]                   multiplied by the query

S4D_g is mechanisms/s4d.py's diagonal SSM (Gu et al. 2022: zero-order hold, S4D-Lin
initialisation by default), one per group: y = K_g * u + D_g u. The shift SSM's kernel is
W_l for l < N and 0 beyond (A the shift matrix, B = e_1: C A^l B = C_l), learned per channel.

Nothing in W, D_k, K_g or D_g depends on the input: the positions are mixed by fixed
convolutions, and the input enters only through the multiplications by v and by q (the
"gating"). Attention weights a position by its content (q . k); H3 can weight by content only
within one position's e x e product, then sums the products of all earlier positions with a
kernel that depends on distance alone. Zoology's analysis: to recall on longer sequences such
a model needs a wider model, where attention does not.

Reference code read (HazyResearch/zoology, the H3 that Zoology trains): ``zoology/mixers/h3/
h3.py`` at 0c59e61 (the layer: q, k, v projections, ``ssm_k_kernel`` in mode 'shift' with its
``ssm_k_D``, k times v per head as an outer product ``b d1 d2 h l``, the diagonal kernel
``SSKernel(H = d_model / head_dim)`` shared by a head's d1 x d2 channels with its ``D``, then
``mul_sum`` with q over d1 and ``output_linear``), ``zoology/mixers/h3/ss_kernel.py`` at 30b5cc1
(the defaults: mode 'diag', measure 'diag-lin', N 64, dt in [1e-3, 1e-1]; the shift kernel's
B = e_1 and its C drawn as torch's Conv1d weights, kaiming-uniform with a = sqrt(5): uniform
in +-1/sqrt(N)). Its ``D`` and ``ssm_k_D`` start standard normal, as here.

In the core track the model's q, k and v projections and its output projection are the
layer's (H3's layer is exactly: projections, this, an output linear), so H3 has no separate
published layer: in the block track it enters as this core in the model's projections
(without the source's projection biases).

Forms of the same function:

- ``h3_reference``: the definition above, one position after another (a buffer of the last
  N keys, the SSM's complex state), the readable reference.
- ``forward``: the N-tap filter as a depthwise ``conv1d`` over the left-padded keys (a direct
  sum over the window: no later input enters), then s4d's ``chunked_s4d`` over u.
- the recurrent form (``initial_state``, ``step``): the last N - 1 keys and the SSM state.

Numerics as s4d's: sums in at least float32 (complex64), the output in v's dtype. Causal
only: both convolutions are causal recurrences.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from synthbench.core.linear_attention import compute_dtype
from synthbench.core.mechanism import MECHANISMS, Mechanism
from synthbench.core.params import check_int
from synthbench.mechanisms.s4d import (
    DT_MAX,
    DT_MIN,
    DiagonalSSM,
    _check_options,
    chunked_s4d,
    discretised,
    s4d_step,
)


def per_channel(ssm_params: dict[str, torch.Tensor], group_size: int) -> dict[str, torch.Tensor]:
    """A group's SSM parameters repeated over its e x e channels: each of shape (H, G, ...)
    -> (H G, e^2, ...), the (heads, channels) layout s4d's forms take."""
    out = {}
    for name, value in ssm_params.items():
        flat = value.reshape(-1, 1, *value.shape[2:])
        out[name] = flat.expand(flat.shape[0], group_size**2, *value.shape[2:])
    return out


def outer(kbar: torch.Tensor, v: torch.Tensor, group_size: int) -> torch.Tensor:
    """u = kbar (x) v per group: (B, H, L, d) twice -> (B, H G, L, e^2), row i of a group's
    e x e block from kbar's channel i, column j from v's channel j."""
    batch, heads, length, dim = v.shape
    groups = dim // group_size
    k_ = kbar.reshape(batch, heads, length, groups, group_size, 1)
    v_ = v.reshape(batch, heads, length, groups, 1, group_size)
    u = (k_ * v_).reshape(batch, heads, length, groups, group_size**2)
    return u.permute(0, 1, 3, 2, 4).reshape(batch, heads * groups, length, group_size**2)


def read_out(y: torch.Tensor, q: torch.Tensor, group_size: int) -> torch.Tensor:
    """out[j] = sum_i q[i] y[i, j] per group: y (B, H G, L, e^2), q (B, H, L, d) -> (B, H, L, d)."""
    batch, heads, length, dim = q.shape
    groups = dim // group_size
    y_ = y.reshape(batch, heads, groups, length, group_size, group_size).permute(0, 1, 3, 2, 4, 5)
    q_ = q.reshape(batch, heads, length, groups, group_size, 1)
    return (q_ * y_).sum(-2).reshape(batch, heads, length, dim)


def h3_reference(q, k, v, shift, shift_D, ssm_params, group_size) -> torch.Tensor:  # noqa: N803
    """The module docstring's definition one position after another: q, k, v (B, H, L, d),
    ``shift`` the taps W (H, d, N) with W_0 on the current key, ``shift_D`` (H, d),
    ``ssm_params`` the SSMs' (DiagonalSSM.params(), over (H, G)). Out in v's dtype."""
    dtype = compute_dtype(q, k, v, shift, *ssm_params.values())
    channels = per_channel(ssm_params, group_size)
    dt_A, B_bar, C = discretised(channels, dtype)  # noqa: N806 - (H G, e^2, M)
    A_bar, D = dt_A.exp(), channels["D"].to(dtype)  # noqa: N806
    q, k, v, taps, skip = (t.to(dtype) for t in (q, k, v, shift, shift_D))
    n_taps = taps.shape[-1]
    state = torch.zeros(v.shape[0], *A_bar.shape, dtype=A_bar.dtype, device=v.device)
    outs = []
    for t in range(v.shape[2]):
        kbar = skip * k[:, :, t]
        for lag in range(min(n_taps, t + 1)):
            kbar = kbar + taps[..., lag] * k[:, :, t - lag]
        u = outer(kbar.unsqueeze(2), v[:, :, t : t + 1], group_size)[:, :, 0]  # (B, H G, e^2)
        state = A_bar * state + B_bar * u.unsqueeze(-1)
        y = 2 * (C * state).sum(-1).real + D * u
        outs.append(read_out(y.unsqueeze(2), q[:, :, t : t + 1], group_size)[:, :, 0])
    return torch.stack(outs, dim=2).to(v.dtype)


def shift_filter(k: torch.Tensor, shift: torch.Tensor, shift_D: torch.Tensor) -> torch.Tensor:  # noqa: N803
    """kbar_t = sum_{l<N} W_l k_{t-l} + D_k k_t for every t: k (B, H, L, d) -> the same shape,
    in the compute dtype. A depthwise conv1d over k padded with N - 1 zeros on the left:
    conv1d correlates, so the taps go in reversed (its last weight meets the current key)."""
    batch, heads, length, dim = k.shape
    n_taps = shift.shape[-1]
    x = k.permute(0, 1, 3, 2).reshape(batch, heads * dim, length)
    weight = shift.reshape(heads * dim, 1, n_taps).flip(-1)
    filtered = F.conv1d(F.pad(x, (n_taps - 1, 0)), weight, groups=heads * dim)
    filtered = filtered.reshape(batch, heads, dim, length).permute(0, 1, 3, 2)
    return filtered + shift_D[:, None, :] * k


@MECHANISMS.register(
    "h3",
    aliases=("hungry-hungry-hippos",),
    complexity="linear",
    family="gated convolution (time-invariant)",
    reference="Fu, Dao, Saab, Thomas, Rudra and Re 2023, Hungry Hungry Hippos (arXiv "
    "2212.14052; H3), as Zoology trains it (Arora et al. 2023, arXiv 2312.04927)",
)
class H3(Mechanism):
    """q (x) [S4D(shift(k) (x) v)] per group of ``group_size`` channels (module docstring):
    two time-invariant convolutions gated by the input. Causal only.

    d_state: N, both the shift filter's taps and the diagonal SSM's real state numbers per
    channel (even; default 64, H3's); group_size: e, H3's head_dim (divides head_dim; default
    1, H3's code; Zoology's MQAR runs use 2); init, dt_min, dt_max, chunk_size: the diagonal
    SSM's, as s4d's."""

    causal_only = True
    has_scores = False  # no score between two positions: kernels by distance, gated

    def __init__(
        self,
        head_dim: int,
        n_heads: int,
        d_state: int = 64,
        group_size: int = 1,
        init: str = "lin",
        dt_min: float = DT_MIN,
        dt_max: float = DT_MAX,
        chunk_size: int = 64,
    ):
        super().__init__(head_dim, n_heads)
        _check_options(d_state, init, dt_min, dt_max, chunk_size)
        check_int("group_size", group_size, 1)
        if head_dim % group_size:
            raise ValueError(f"group_size {group_size} must divide head_dim {head_dim}")
        self.group_size, self.chunk_size, self.d_state = group_size, chunk_size, d_state
        bound = 1 / math.sqrt(d_state)  # torch's Conv1d init, as the shift kernel's C
        self.shift = nn.Parameter(torch.empty(n_heads, head_dim, d_state).uniform_(-bound, bound))
        self.shift_D = nn.Parameter(torch.randn(n_heads, head_dim))
        self.ssm = DiagonalSSM((n_heads, head_dim // group_size), d_state, init, dt_min, dt_max)

    def forward(self, q, k, v, causal: bool = True):
        if not causal:
            raise ValueError("h3 is causal only: its convolutions are causal recurrences")
        dtype = compute_dtype(q, k, v, self.shift)
        kbar = shift_filter(k.to(dtype), self.shift.to(dtype), self.shift_D.to(dtype))
        u = outer(kbar, v.to(dtype), self.group_size)
        y = chunked_s4d(u, per_channel(self.ssm.params(), self.group_size), self.chunk_size)
        return read_out(y, q.to(dtype), self.group_size).to(v.dtype)

    def state_size(self, seq_len: int) -> int:
        """The last N - 1 keys (d each) and, per group, e^2 channels of N real numbers."""
        groups = self.head_dim // self.group_size
        return (self.d_state - 1) * self.head_dim + groups * self.group_size**2 * self.d_state

    def initial_state(self, batch: int, device, dtype: torch.dtype):
        """(the last N - 1 keys, oldest first; the SSMs' complex state), all zero."""
        compute = torch.promote_types(dtype, torch.float32)
        keys = torch.zeros(batch, self.n_heads, self.d_state - 1, self.head_dim,
                           device=device, dtype=compute)  # fmt: skip
        groups = self.n_heads * (self.head_dim // self.group_size)
        ssm = torch.zeros(batch, groups, self.group_size**2, self.d_state // 2,
                          device=device, dtype=compute.to_complex())  # fmt: skip
        return keys, ssm

    def step(self, state, q, k, v):
        """One position: q, k, v (batch, heads, head_dim)."""
        keys, ssm = state
        dtype = compute_dtype(q, k, v, self.shift)
        window = torch.cat([keys.to(dtype), k.to(dtype).unsqueeze(2)], dim=2)  # oldest first
        taps = self.shift.to(dtype).flip(-1)  # W_(N-1) .. W_0, to meet the window's order
        kbar = torch.einsum("bhnd,hdn->bhd", window, taps) + self.shift_D.to(dtype) * k.to(dtype)
        u = outer(kbar.unsqueeze(2), v.to(dtype).unsqueeze(2), self.group_size)[:, :, 0]
        y, ssm = s4d_step(ssm, u, per_channel(self.ssm.params(), self.group_size))
        out = read_out(y.unsqueeze(2), q.to(dtype).unsqueeze(2), self.group_size)[:, :, 0]
        return out.to(v.dtype), (window[:, :, 1:], ssm)
