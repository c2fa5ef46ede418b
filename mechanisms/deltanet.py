"""DeltaNet: linear attention with the delta rule (Schlag et al. 2021, Linear Transformers Are
Secretly Fast Weight Programmers), computed chunk by chunk as in Yang et al. 2024
(Parallelizing Linear Transformers with the Delta Rule over Sequence Length, arXiv 2406.06484:
the WY representation and the UT transform).

Per head, with d = head_dim, q_t, k_t, v_t in R^d (rows of the (batch, heads, length, d)
inputs) and the extra input ``beta`` (batch, heads, length, 1), raw:

    k^_t    = k_t / sqrt(|k_t|^2 + 1e-6)                  (L2 normalisation, eps 1e-6)
    q^_t    = q_t / sqrt(|q_t|^2 + 1e-6) * d^(-1/2)       (L2 normalisation, then the scale)
    b_t     = sigmoid(beta_t)                             (the write strength, in (0, 1))
    S_t     = S_{t-1} - b_t k^_t (k^_t^T S_{t-1}) + b_t k^_t v_t^T,      S_{-1} = 0
            = (I - b_t k^_t k^_t^T) S_{t-1} + b_t k^_t v_t^T
    o_t     = q^_t^T S_t                                   (a row of length d)

S_t is d x d, indexed (key coordinate, value coordinate); Yang et al. write its transpose
(S_t = S_{t-1} (I - b_t k_t k_t^T) + b_t v_t k_t^T, o_t = S_t q_t), the same function. In words:
the memory reads what it stores under k^_t, k^_t^T S_{t-1}, and moves it a fraction b_t of
the way to v_t: the delta rule. The output reads the state after the write (o_t sees v_t).

Choices, and where they come from:

- q and k are L2-normalised inside the mechanism, as Yang et al. 2024 do (the
  normalisation keeps every I - b k k^T a contraction, eigenvalues in [1 - b, 1], so S stays
  bounded for any sequence); the eps inside the square root (fla's ``l2norm``, 1e-6) makes it
  smooth at 0 and leaves |k^| slightly below 1. Schlag et al. 2021 normalise features by
  their sum instead (after DPFP); Yang et al. found L2 better.
- q is also scaled by d^(-1/2), as flash-linear-attention's ``chunk_delta_rule`` does by
  default (``scale = k.shape[-1] ** -0.5``, also when its ``use_qk_l2norm_in_kernel`` is on,
  which is how its ``DeltaNet`` layer calls it).
- b_t = sigmoid of the raw extra input (fla's ``b_proj(...).sigmoid()``; the model's
  projection makes it in the core track, synthbench/core/model.py). The core keeps b in
  (0, 1); fla's ``allow_neg_eigval`` (b in (0, 2), eigenvalues of I - b k k^T down to -1) is
  an option of the published layer only, through the helpers' ``beta_max``.
- Left to the model in the core track, as for every mechanism here: the short causal
  convolution and SiLU on q, k, v before the kernel and the per-head norm (and gate) after,
  which fla's layer has; the block track's ``DeltaNetLayer`` (below) has them all. No
  positions either (``--pos``).
- Causal only: the delta rule is a recurrence; ``causal=False`` raises ValueError.

Three forms of the same function:

- ``delta_rule_reference``: the recurrence above, one token at a time (as flash-linear-
  attention's ``fla/ops/delta_rule/naive.py``), the readable reference.
- ``chunked_delta_rule`` (``forward``): N = ceil(L / chunk_size) chunks of C = ceil(L / N)
  positions (the last one zero-padded: a padded position has k^ = 0, v = 0, b = 0, so it
  writes nothing, and it comes after every real position). Inside chunk n, with S the state
  before the chunk and K (C x d), V (C x d), Q (C x d) its normalised rows, B = diag(b):

      A = strictly lower triangular part of B K K^T   (A_ij = b_i k^_i . k^_j for j < i)
      T = (I + A)^(-1)                                (the UT transform: unit lower
                                                       triangular, by a triangular solve)
      W = T B K,  U~ = T B V                           (the WY representation)
      U = U~ - W S                                     (row i: u_i = b_i (v_i - S_{i-1}^T k^_i),
                                                       the "pseudo-value" actually written)
      O = Q S + tril(Q K^T) U                          (tril keeps the diagonal: o_t sees v_t)
      S <- S + K^T U

  Why: writing u_i = b_i (v_i - S_{i-1}^T k^_i), the recurrence is S_i = S_{i-1} + k^_i u_i^T,
  so S_{i-1} = S + sum_{j<i} k^_j u_j^T and u_i = b_i (v_i - S^T k^_i - sum_{j<i} (k^_i . k^_j)
  u_j), i.e. (I + A) U = B V - B K S. T, W and U~ are computed for every chunk at once; only
  the d x d state recurrence loops over the chunks. Cost O(L C d + L d^2); no L x L matrix.
- the recurrent form (``initial_state``, ``step``): S, d x d numbers per head whatever L.

Numerics: everything in at least float32 (``compute_dtype``), returned in v's dtype. Inputs
scaled x100 change only how saturated b is (q and k are normalised), so outputs grow only as v.

The published layer (``DeltaNetLayer``, the block track): flash-linear-attention's
``fla/layers/delta_net.py`` (class ``DeltaNet``, commit bc3b101) with its defaults, the layer of
Yang et al. 2024 (arXiv 2406.06484, the section "DeltaNet Transformer" and its architecture
figure: short convolution, SiLU and L2 normalisation on q and k, sigmoid beta, RMSNorm on the
output). x (B, L, d_model), head_dim = d_model / H (fla's ``expand_k = expand_v = 1``), in
this order:

1. q, k, v = x W_q, x W_k, x W_v: ``q_proj``, ``k_proj``, ``v_proj``, Linear without bias.
2. each through its own ``ShortConvolution`` (depthwise causal, kernel ``conv_size`` 4, no
   bias) then SiLU (fla's ``q_conv1d``, ``k_conv1d``, ``v_conv1d``, activation 'silu' as its
   default ``qk_activation='silu'`` gives); ``use_short_conv=False``: SiLU alone, as fla.
3. per head: q, k L2-normalised (eps 1e-6) and q scaled by head_dim^-1/2 inside the kernel
   (fla's ``use_qk_l2norm_in_kernel=True`` for ``qk_norm='l2'``): ``chunked_delta_rule``.
4. b = sigmoid(x W_b), one per head (``b_proj``, no bias; fla ``use_beta=True``), times 2 with
   ``allow_neg_eigval`` (fla; Grazzi et al. 2024, arXiv 2411.12537).
5. the delta rule above, chunked (``chunk_size``) for ``forward``, one step for ``step``.
6. per-head output norm, eps ``norm_eps`` 1e-5 (the layer's default; fla's DeltaNetConfig
   passes 1e-6): RMSNorm with a learned scale (fla ``o_norm = RMSNorm``), or with
   ``use_gate`` (fla default False) rmsnorm(o) * w * silu(g), g = x W_g (``g_proj``, no
   bias; fla ``FusedRMSNormGated``, activation 'swish').
7. o W_o (``o_proj``, no bias) back to d_model.

Initial values: Linear and Conv1d keep PyTorch's default init (the same for every layer here;
fla's layer adds none of its own), the norm scales are ones (fla/modules/layernorm.py,
fused_norm_gate.py). Not carried over: fla's ``qk_activation`` / ``qk_norm`` alternatives
(relu, elu+1, sum norm), ``use_beta=False``, ``expand_k`` / ``expand_v`` and the attention mask.
The recurrent state of the whole layer: the three convolution windows ((conv_size - 1) x
d_model each) and S per head.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from synthbench.core.layer import GatedRMSNorm, Layer, RMSNorm, ShortConvolution
from synthbench.core.linear_attention import chunking, compute_dtype
from synthbench.core.mechanism import MECHANISMS, MatrixStateMechanism
from synthbench.core.params import check_int, check_positive

L2_EPS = 1e-6  # inside the square root of the L2 normalisation (fla's l2norm)


def l2_normalise(x: torch.Tensor) -> torch.Tensor:
    """x / sqrt(|x|^2 + L2_EPS) along the last dimension."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2_EPS)


def _prepared(q, k, v, beta, beta_max: float = 1.0):
    """q^ (normalised, scaled), k^ (normalised), v and b = beta_max * sigmoid(beta), all in
    the compute dtype; beta (..., 1) stays (..., 1). beta_max is 1 for the core, 2 for the
    layer's ``allow_neg_eigval`` (times 1.0 is exact: the core's b is sigmoid(beta))."""
    dtype = compute_dtype(q, k, v, beta)
    q, k, v, beta = (t.to(dtype) for t in (q, k, v, beta))
    b = torch.sigmoid(beta) * beta_max
    return l2_normalise(q) / math.sqrt(q.shape[-1]), l2_normalise(k), v, b


def _check_inputs(causal: bool, beta: torch.Tensor | None) -> None:
    if not causal:
        raise ValueError("deltanet is causal only: the delta rule is a recurrence")
    if beta is None:
        raise ValueError("deltanet needs its extra input beta (batch, heads, length, 1)")


def delta_rule_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, beta_max: float = 1.0
) -> torch.Tensor:
    """The recurrence of the module docstring, token after token: q, k, v (B, H, L, d), beta
    (B, H, L, 1) raw -> (B, H, L, d) in v's dtype. b = beta_max * sigmoid(beta)."""
    out_dtype = v.dtype
    q, k, v, b = _prepared(q, k, v, beta, beta_max)
    batch, heads, length, dim = q.shape
    state = q.new_zeros(batch, heads, dim, v.shape[-1])  # S: (key coordinate, value coordinate)
    outs = []
    for t in range(length):
        q_t, k_t, v_t, b_t = q[:, :, t], k[:, :, t], v[:, :, t], b[:, :, t, :, None]
        k_col = k_t.unsqueeze(-1)  # (B, H, d, 1)
        read = k_col.mT @ state  # k^_t^T S_{t-1}: (B, H, 1, d)
        state = state - b_t * k_col @ read + b_t * k_col @ v_t.unsqueeze(-2)
        outs.append((q_t.unsqueeze(-2) @ state).squeeze(-2))  # q^_t^T S_t
    return torch.stack(outs, dim=-2).to(out_dtype)


def chunked_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    chunk_size: int = 64,
    beta_max: float = 1.0,
) -> torch.Tensor:
    """The chunkwise (WY / UT-transform) form of the module docstring: the same function as
    ``delta_rule_reference``, q, k, v (B, H, L, d), beta (B, H, L, 1) raw -> (B, H, L, d).
    b = beta_max * sigmoid(beta) (the derivation holds for any b)."""
    out_dtype = v.dtype
    q, k, v, b = _prepared(q, k, v, beta, beta_max)
    batch, heads, length, dim = q.shape
    dim_v = v.shape[-1]
    N, C = chunking(length, chunk_size)
    pad = N * C - length

    def chunks(t: torch.Tensor) -> torch.Tensor:  # zero-padded, (B, H, N, C, width)
        return F.pad(t, (0, 0, 0, pad)).reshape(batch, heads, N, C, t.shape[-1])

    q, k, v, b = chunks(q), chunks(k), chunks(v), chunks(b)
    # every chunk at once: A, then W = T B K and U~ = T B V by one triangular solve of I + A.
    # The solve reads only the strictly lower part of its matrix (unitriangular: the unit
    # diagonal of I + A is implied, and its gradient is that part's), so it is given B K K^T
    # whole: its strictly lower part is A (A_ij = b_i k^_i . k^_j for j < i)
    bk = b * k
    wu = torch.linalg.solve_triangular(
        bk @ k.mT, torch.cat([bk, b * v], dim=-1), upper=False, unitriangular=True
    )
    w, u_tilde = wu.split([dim, dim_v], dim=-1)
    # across chunks: the state before each chunk, S <- S + K^T (U~ - W S); the chunks taken
    # apart by unbind (one stack backwards), not by indexing
    states = [q.new_zeros(batch, heads, dim, dim_v)]
    ks, ws, us = k.unbind(2), w.unbind(2), u_tilde.unbind(2)
    for n in range(N - 1):
        s = states[-1]
        states.append(s + ks[n].mT @ (us[n] - ws[n] @ s))
    before = torch.stack(states, dim=2)  # (B, H, N, d, d_v)
    u = u_tilde - w @ before
    out = q @ before + (q @ k.mT).tril() @ u  # (B, H, N, C, d_v)
    return out.reshape(batch, heads, N * C, dim_v)[:, :, :length].to(out_dtype)


def delta_rule_step(state, q, k, v, beta, beta_max: float = 1.0):
    """One position of the recurrence: state S (B, H, d, d_v), q, k, v (B, H, d), beta
    (B, H, 1) raw -> (o (B, H, d_v) in v's dtype, the new S). S <- S + b k^ (v - S^T k^)^T,
    then o = q^^T S, b = beta_max * sigmoid(beta). Not in place: autograd sees every state."""
    out_dtype = v.dtype
    q, k, v, b = _prepared(q, k, v, beta, beta_max)
    dtype = torch.promote_types(q.dtype, state.dtype)
    q, k, v, b = q.to(dtype), k.to(dtype), v.to(dtype), b.to(dtype)
    read = (k.unsqueeze(-2) @ state).squeeze(-2)  # S^T k^: (B, H, d)
    state = state + (b * k).unsqueeze(-1) * (v - read).unsqueeze(-2)
    out = (q.unsqueeze(-2) @ state).squeeze(-2)
    return out.to(out_dtype), state


@MECHANISMS.register(
    "deltanet",
    aliases=("delta-rule",),
    complexity="linear",
    family="delta-rule",
    reference="Schlag et al. 2021, Linear Transformers Are Secretly Fast Weight Programmers; "
    "chunked as Yang et al. 2024 (arXiv 2406.06484)",
)
class DeltaNet(MatrixStateMechanism):
    """The delta rule: S_t = S_{t-1} - b_t k^_t (k^_t^T S_{t-1}) + b_t k^_t v_t^T,
    o_t = q^_t^T S_t, with q, k L2-normalised (q then scaled by head_dim^-1/2) and
    b_t = sigmoid(beta_t), ``beta`` an extra input of width 1. Causal only (causal=False
    raises ValueError). The exact definition, the chunked form and the choices: the module
    docstring.

    chunk_size: positions per chunk of the chunkwise form (>= 1, default 64; any value gives
    the same function)."""

    signed = True  # its implicit attention weights take either sign

    def __init__(self, head_dim: int, n_heads: int, chunk_size: int = 64):
        super().__init__(head_dim, n_heads)
        check_int("chunk_size", chunk_size, 1)
        self.chunk_size = chunk_size
        self.extra_inputs = {"beta": 1}

    def forward(self, q, k, v, causal: bool = True, beta: torch.Tensor | None = None):
        _check_inputs(causal, beta)
        return chunked_delta_rule(q, k, v, beta, self.chunk_size)

    def step(self, state, q, k, v, beta: torch.Tensor | None = None):
        """One position: q, k, v (batch, heads, head_dim), beta (batch, heads, 1) raw.
        S <- S + b k^ (v - S^T k^)^T, then o = q^^T S. Not in place: autograd sees every
        state."""
        _check_inputs(True, beta)
        return delta_rule_step(state, q, k, v, beta)


class DeltaNetLayer(Layer):
    """DeltaNet as its published layer (fla/layers/delta_net.py; the parts and their sources:
    "The published layer" in the module docstring): x (B, L, d_model) -> (B, L, d_model).

    Options, fla's defaults: conv_size 4, use_short_conv True, conv_bias False, use_gate False,
    allow_neg_eigval False (b in (0, 1); True: (0, 2)), norm_eps 1e-5, chunk_size 64 (the
    chunkwise kernel's; any value gives the same function). Causal only."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        conv_size: int = 4,
        use_short_conv: bool = True,
        conv_bias: bool = False,
        use_gate: bool = False,
        allow_neg_eigval: bool = False,
        norm_eps: float = 1e-5,
        chunk_size: int = 64,
    ):
        super().__init__(d_model, n_heads)
        if d_model % n_heads:
            raise ValueError(f"n_heads {n_heads} must divide d_model {d_model}")
        check_int("conv_size", conv_size, 1)
        check_int("chunk_size", chunk_size, 1)
        check_positive(norm_eps=norm_eps)
        flags = {"use_short_conv": use_short_conv, "conv_bias": conv_bias, "use_gate": use_gate,
                 "allow_neg_eigval": allow_neg_eigval}  # fmt: skip
        for name, value in flags.items():
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be True or False, got {value!r}")
        self.head_dim = d_model // n_heads
        self.conv_size, self.use_short_conv, self.use_gate = conv_size, use_short_conv, use_gate
        self.chunk_size = chunk_size
        self.beta_max = 2.0 if allow_neg_eigval else 1.0
        self.q_proj, self.k_proj, self.v_proj = (
            nn.Linear(d_model, d_model, bias=False) for _ in range(3)
        )
        self.b_proj = nn.Linear(d_model, n_heads, bias=False)
        if use_short_conv:
            self.q_conv, self.k_conv, self.v_conv = (
                ShortConvolution(d_model, conv_size, bias=conv_bias) for _ in range(3)
            )
        if use_gate:
            self.g_proj = nn.Linear(d_model, d_model, bias=False)
            self.o_norm = GatedRMSNorm(self.head_dim, eps=norm_eps, norm_before_gate=True)
        else:
            self.o_norm = RMSNorm(self.head_dim, eps=norm_eps)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        """(..., d_model) -> (..., n_heads, head_dim)."""
        return t.unflatten(-1, (self.n_heads, self.head_dim))

    def _output(self, o: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The per-head norm (and gate) and the output projection: o (..., n_heads, head_dim)
        from the kernel, x (..., d_model) the layer's input -> (..., d_model)."""
        if self.use_gate:
            o = self.o_norm(o, self._heads(self.g_proj(x)))
        else:
            o = self.o_norm(o)
        return self.o_proj(o.flatten(-2))

    def forward(self, x: torch.Tensor, causal: bool = True) -> torch.Tensor:
        self.check_causal(causal)
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if self.use_short_conv:
            q, k, v = self.q_conv(q), self.k_conv(k), self.v_conv(v)
        else:
            q, k, v = F.silu(q), F.silu(k), F.silu(v)
        q, k, v = (self._heads(t).transpose(1, 2) for t in (q, k, v))  # (B, H, L, d)
        beta = self.b_proj(x).transpose(1, 2).unsqueeze(-1)  # (B, H, L, 1), raw
        o = chunked_delta_rule(q, k, v, beta, self.chunk_size, beta_max=self.beta_max)
        return self._output(o.transpose(1, 2), x)

    def initial_state(self, batch: int, device, dtype: torch.dtype):
        """(q, k, v convolution windows, or None without the convolution; S = 0 per head)."""
        convs = (self.q_conv, self.k_conv, self.v_conv) if self.use_short_conv else ()
        windows = tuple(c.initial_state(batch, device, dtype) for c in convs) or (None,) * 3
        shape = (batch, self.n_heads, self.head_dim, self.head_dim)
        s = torch.zeros(shape, device=device, dtype=torch.promote_types(dtype, torch.float32))
        return (*windows, s)

    def step(self, state, x: torch.Tensor):
        """One position: x (B, d_model) -> (y (B, d_model), the new state); not in place."""
        cq, ck, cv, s = state
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if self.use_short_conv:
            (q, cq), (k, ck), (v, cv) = (
                self.q_conv.step(cq, q),
                self.k_conv.step(ck, k),
                self.v_conv.step(cv, v),
            )
        else:
            q, k, v = F.silu(q), F.silu(k), F.silu(v)
        beta = self.b_proj(x).unsqueeze(-1)  # (B, H, 1), raw
        o, s = delta_rule_step(s, *(self._heads(t) for t in (q, k, v)), beta, self.beta_max)
        return self._output(o, x), (cq, ck, cv, s)

    def state_size(self, seq_len: int) -> int:
        """Three convolution windows of (conv_size - 1) x d_model, and S (head_dim^2) per
        head, whatever the length."""
        conv = 3 * (self.conv_size - 1) * self.d_model if self.use_short_conv else 0
        return conv + self.n_heads * self.head_dim * self.head_dim


DeltaNet.layer = DeltaNetLayer
