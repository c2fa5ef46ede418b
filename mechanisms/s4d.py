"""S4D: a diagonal state-space model whose parameters do not depend on the input (Gu, Gupta,
Goel and Re 2022, On the Parameterization and Initialization of Diagonal State Space Models,
arXiv 2206.11893): a linear time-invariant (LTI) recurrence, the S4 side of the Mamba paper's
selective-copying comparison (Gu and Dao 2023, arXiv 2312.00752, Table 1).

Per head h, each of its d = head_dim channels c is its own single-input SSM with M = d_state / 2
complex modes n and learned parameters that no input touches (sec. 3 of the paper; the
reference code ``SSMKernelDiag``, state-spaces/s4 src/models/sequence/kernels/ssm.py at
070384a, and its minimal version ``S4DKernel``/``S4D``, models/s4/s4d.py at 2ed46fc):

    Delta_c = exp(log_dt_c)                          the step, one per channel (dt tied over n)
    A_n     = -exp(log_A_real_n) + i A_imag_n        (real part < 0: every mode decays)
    B_n, C_n complex, D_c real

discretised by zero-order hold (the code's default ``disc='zoh'``):

    Abar_n = exp(Delta A_n),   Bbar_n = B_n (exp(Delta A_n) - 1) / A_n

and run over the channel's input u_t (here the value coordinate v_t[c]):

    x_t = Abar x_{t-1} + Bbar u_t                    (x_{-1} = 0: M complex numbers)
    y_t = 2 Re(sum_n C_n x_{t,n}) + D u_t

Each mode stands for itself and its complex conjugate (the factor 2 Re, the code's
``2*y.real``): the state is 2M = d_state real numbers per channel. Unrolled, y is a causal
convolution of u with the SSM kernel, the paper's Vandermonde form:

    K_l = 2 Re(sum_n C_n Bbar_n Abar_n^l),   y_t = sum_{s <= t} K_{t-s} u_s + D u_t

Nothing in A, B, C, Delta or D depends on the input: the same kernel at every position and for
every sequence (tests/test_s4d.py checks that a shifted input gives a shifted output).

Initialisation (sec. 4 of the paper; dplr.py ``dplr``, state-spaces/s4 src/models/sequence/
kernels/dplr.py at 1eb1007, with ``B_init='constant'``; draws from torch's global generator in
the minimal code's order, D, then Delta, then C):

- ``init='lin'`` (S4D-Lin, the default): A_n = -1/2 + i pi n, n = 0 .. M - 1;
  ``init='inv'`` (S4D-Inv): A_n = -1/2 + i (N / pi) (N / (2n + 1) - 1), N = d_state.
  The code writes A with a negative imaginary part; a conjugate mode gives the same kernels.
- Delta log-uniform in [dt_min, dt_max] = [1e-3, 1e-1] (``log_dt``).
- B_n = 1, C_n complex standard normal (real and imaginary parts each of variance 1/2,
  ``torch.randn(..., dtype=cfloat)``), D standard normal.

As in the code, A, B and Delta are not weight-decayed (``_no_weight_decay``; the source sets
their weight decay to 0); C and D are. Left out: the source's separate, lower learning rate for
A, B and Delta (0.001 in its examples): here every parameter trains at the run's lr, as for
every mechanism; its other discretisations (bilinear, DSS), other A transforms and the
S4D-LegS and S4D-Real inits; the low-rank term of S4 (DPLR), zero here.

In the core track this mechanism reads v only: q and k are not used (their projections get no
gradient, as with ``none``). Where attention reads its state by content (q . k) and
Mamba-2 by the input-dependent B_t, C_t, Delta_t, S4D's readout is fixed: it can only weight
positions by distance.

Three forms of the same function (and the published layer below):

- ``s4d_reference``: the recurrence above, one position at a time, the readable reference.
- ``chunked_s4d`` (``forward``): N = ceil(L / chunk_size) chunks of C positions. Inside a
  chunk the causal Toeplitz product with K_0 .. K_{C-1} (entries above the diagonal exactly 0);
  across chunks the complex state: with S_k the state before chunk k and t = kC + a,

      y_t    += 2 Re(sum_n C_n Abar_n^(a+1) S_{k,n})
      S_{k+1} = Abar^C S_k + sum_b Abar^(C-1-b) Bbar u_{kC+b}

  the in-chunk products and each chunk's writes for all chunks at once; only the state
  recurrence loops over chunks. Cost O(L (C + M) d) per head; no L x L matrix, no FFT (a
  causal convolution by FFT leaves rounding noise at later positions: outputs would depend on
  the future by 1e-17, which the causality check, rightly, does not pass).
- the recurrent form (``initial_state``, ``step``): x, d x M complex numbers per head.

The published layer (``S4DLayer``, ``S4D.layer``, the block track): the S4D block of the
minimal code (models/s4/s4d.py ``S4D.forward``): every one of the d_model channels of x
through its own SSM with the D skip, then GELU, then the position-wise output transform, a
1 x 1 convolution to 2 d_model channels (a Linear with bias here, the same map) and a GLU.
No input projection (the source has none). Dropout 0. The model's ``n_heads`` is not used:
the SSM is per channel.

Numerics: every power of Abar is exp(l Delta A) with l >= 0 and Re(Delta A) < 0, so of
modulus at most 1; nothing overflows at any length. Sums run in at least float32 (complex64;
complex128 for float64 inputs); the output comes back in v's dtype. Causal only: the SSM is a
recurrence.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from synthbench.core.layer import Layer
from synthbench.core.linear_attention import chunking, compute_dtype
from synthbench.core.mechanism import MECHANISMS, Mechanism
from synthbench.core.params import check_int, check_positive

INITS = ("lin", "inv")  # S4D-Lin, S4D-Inv (sec. 4)
DT_MIN, DT_MAX = 1e-3, 1e-1  # Delta log-uniform between them (ssm.py's dt_min, dt_max)
A_REAL = 0.5  # every mode starts at Re(A) = -1/2 (dplr.py, real_random=False)


def initial_A_imag(channels: tuple[int, ...], d_state: int, init: str) -> torch.Tensor:  # noqa: N802
    """Im(A_n) for n = 0 .. d_state / 2 - 1, repeated over ``channels``: pi n (S4D-Lin) or
    (N / pi) (N / (2n + 1) - 1) with N = d_state (S4D-Inv)."""
    n = torch.arange(d_state // 2, dtype=torch.float64)
    if init == "lin":
        imag = math.pi * n
    else:
        imag = d_state / math.pi * (d_state / (2 * n + 1) - 1)
    return imag.float().expand(*channels, -1).clone()


def _complex(pair: torch.Tensor) -> torch.Tensor:
    """A complex tensor from its real view (..., 2). torch.complex rather than
    view_as_complex: it needs no particular stride, so it runs under torch.func's vmap."""
    return torch.complex(pair[..., 0], pair[..., 1])


SSM_PARAMS = ("log_dt", "log_A_real", "A_imag", "B", "C")  # what the discretisation reads


def discretised(params: dict[str, torch.Tensor], dtype: torch.dtype):
    """(Delta A, Bbar, C) of every mode, complex of ``dtype`` (float32 or float64), each (...,
    d, M), from the parameters (log_dt (..., d); log_A_real, A_imag (..., d, M); B and C as
    real pairs (..., d, M, 2))."""
    log_dt, log_A_real, A_imag, B, C = (params[name].to(dtype) for name in SSM_PARAMS)  # noqa: N806
    A = torch.complex(-log_A_real.exp(), A_imag)  # noqa: N806
    dt_A = log_dt.exp().unsqueeze(-1) * A
    B_bar = _complex(B) * (dt_A.exp() - 1) / A  # noqa: N806 - zero-order hold
    return dt_A, B_bar, _complex(C)


def _check_causal(causal: bool) -> None:
    if not causal:
        raise ValueError("s4d is causal only: the state-space model is a recurrence")


def s4d_reference(u: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
    """The recurrence of the module docstring, one position after another: u (B, H, L, d)
    -> y (B, H, L, d) in u's dtype; ``params`` the mechanism's (``DiagonalSSM.params()``)."""
    dtype = compute_dtype(u, *params.values())
    dt_A, B_bar, C = discretised(params, dtype)  # noqa: N806
    A_bar, D = dt_A.exp(), params["D"].to(dtype)  # noqa: N806
    x = torch.zeros(u.shape[0], *A_bar.shape, dtype=A_bar.dtype, device=u.device)
    outs = []
    for t in range(u.shape[2]):
        u_t = u[:, :, t].to(dtype)  # (B, H, d)
        x = A_bar * x + B_bar * u_t.unsqueeze(-1)
        outs.append(2 * (C * x).sum(-1).real + D * u_t)
    return torch.stack(outs, dim=2).to(u.dtype)


def ssm_kernel(dt_A: torch.Tensor, weights: torch.Tensor, length: int) -> torch.Tensor:  # noqa: N803
    """K_l = 2 Re(sum_n w_n exp(l Delta A_n)) for l = 0 .. length - 1: (..., d, length) real,
    from Delta A and w = C Bbar, each (..., d, M)."""
    steps = torch.arange(length, device=dt_A.device, dtype=dt_A.real.dtype)
    powers = (dt_A.unsqueeze(-1) * steps).exp()  # (..., d, M, length), modulus <= 1
    return 2 * (weights.unsqueeze(-1) * powers).sum(-2).real


def chunked_s4d(
    u: torch.Tensor, params: dict[str, torch.Tensor], chunk_size: int = 64
) -> torch.Tensor:
    """The chunked form of the module docstring: the same function as ``s4d_reference``,
    u (B, H, L, d) -> (B, H, L, d) in u's dtype."""
    out_dtype = u.dtype
    dtype = compute_dtype(u, *params.values())
    dt_A, B_bar, C = discretised(params, dtype)  # noqa: N806 - (H, d, M) complex
    batch, heads, length, dim = u.shape
    n_chunks, size = chunking(length, chunk_size)
    u = F.pad(u.to(dtype), (0, 0, 0, n_chunks * size - length))
    u = u.reshape(batch, heads, n_chunks, size, dim)  # zeros past the end write nothing

    # inside each chunk: the causal Toeplitz matrix T_ab = K_(a-b), exactly 0 where b > a
    kernel = ssm_kernel(dt_A, C * B_bar, size)  # (H, d, C)
    a = torch.arange(size, device=u.device)
    lag = a[:, None] - a[None, :]
    toeplitz = kernel[..., lag.clamp(min=0)] * (lag >= 0)  # (H, d, C, C)
    out = torch.einsum("hdab,zhnbd->zhnad", toeplitz, u)
    if n_chunks > 1:
        to_end = (dt_A.unsqueeze(-1) * (size - 1 - a)).exp()  # Abar^(C-1-b): (H, d, M, C)
        writes = torch.einsum(
            "hdmb,zhnbd->zhndm", B_bar.unsqueeze(-1) * to_end, u.to(dt_A.dtype)
        )  # what each chunk adds to the state, at its end: (B, H, N, d, M)
        per_chunk = (dt_A * size).exp()  # Abar^C
        states = [torch.zeros_like(writes[:, :, 0])]
        for k in range(n_chunks - 1):
            states.append(per_chunk * states[-1] + writes[:, :, k])
        before = torch.stack(states, dim=2)  # S_k, the state before chunk k
        read = C.unsqueeze(-1) * (dt_A.unsqueeze(-1) * (a + 1)).exp()  # C Abar^(a+1)
        out = out + 2 * torch.einsum("hdma,zhndm->zhnad", read, before).real
    out = out + params["D"].to(dtype)[:, None, None, :] * u  # D (H, d): per channel
    return out.reshape(batch, heads, n_chunks * size, dim)[:, :, :length].to(out_dtype)


def s4d_step(state: torch.Tensor, u: torch.Tensor, params: dict[str, torch.Tensor]):
    """One position: state x (batch, H, d, M) complex, u (batch, H, d) -> (y in u's dtype,
    the new x). x <- Abar x + Bbar u, y = 2 Re(C . x) + D u. Not in place."""
    dtype = compute_dtype(u, *params.values())
    dt_A, B_bar, C = discretised(params, dtype)  # noqa: N806
    u_c = u.to(dtype)
    state = dt_A.exp() * state.to(dt_A.dtype) + B_bar * u_c.unsqueeze(-1)
    y = 2 * (C * state).sum(-1).real + params["D"].to(dtype) * u_c
    return y.to(u.dtype), state


def initial_parameters(channels: tuple[int, ...], d_state: int, init: str, dt_min, dt_max):
    """The source's initial values (module docstring), drawn from torch's global generator
    in its order (D, Delta, C): a dict of float32 tensors over ``channels``."""
    modes = (*channels, d_state // 2)
    D = torch.randn(channels)  # noqa: N806
    log_dt = torch.rand(channels) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)
    C = torch.view_as_real(torch.randn(modes, dtype=torch.cfloat))  # noqa: N806
    return {
        "log_dt": log_dt,
        "log_A_real": torch.full(modes, math.log(A_REAL)),
        "A_imag": initial_A_imag(channels, d_state, init),
        "B": torch.view_as_real(torch.ones(modes, dtype=torch.cfloat)),
        "C": C.clone(),
        "D": D,
    }


NOT_DECAYED = ("log_dt", "log_A_real", "A_imag", "B")  # the source sets their weight decay to 0


def _check_options(d_state: int, init: str, dt_min, dt_max, chunk_size: int) -> None:
    check_int("d_state", d_state, 2)
    if d_state % 2:
        raise ValueError(f"d_state must be even (complex modes come in pairs), got {d_state}")
    if init not in INITS:
        raise ValueError(f"init must be one of {', '.join(INITS)} (S4D-Lin, S4D-Inv), got {init!r}")
    check_positive(dt_min=dt_min, dt_max=dt_max)
    if dt_max < dt_min:
        raise ValueError(f"dt_max {dt_max} must be >= dt_min {dt_min}")
    check_int("chunk_size", chunk_size, 1)


class DiagonalSSM(nn.Module):
    """The SSM parameters of a set of channels (``channels``: a shape, e.g. (heads, head_dim)),
    each its own S4D with d_state / 2 complex modes: registered as parameters (B and C as
    real pairs), A, B and Delta marked ``_no_weight_decay``."""

    def __init__(self, channels, d_state: int, init: str, dt_min: float, dt_max: float):
        super().__init__()
        for name, value in initial_parameters(channels, d_state, init, dt_min, dt_max).items():
            setattr(self, name, nn.Parameter(value))
            if name in NOT_DECAYED:
                getattr(self, name)._no_weight_decay = True
        self.d_state = d_state

    def params(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name) for name in (*SSM_PARAMS, "D")}

    def initial_state(self, batch: int, device, dtype: torch.dtype) -> torch.Tensor:
        """x = 0: (batch, *channels, M) complex, of at least float32's precision."""
        complex_dtype = torch.promote_types(dtype, torch.float32).to_complex()
        shape = (batch, *self.D.shape, self.d_state // 2)
        return torch.zeros(shape, device=device, dtype=complex_dtype)


@MECHANISMS.register(
    "s4d",
    complexity="linear",
    family="ssm (time-invariant)",
    reference="Gu, Gupta, Goel and Re 2022, On the Parameterization and Initialization of "
    "Diagonal State Space Models (arXiv 2206.11893; S4D)",
)
class S4D(Mechanism):
    """Per head and value channel a diagonal SSM of d_state / 2 complex modes whose A, B, C,
    Delta and D are learned and do not depend on the input: y = K * v + D v (q and k unused).
    Causal only (causal=False raises ValueError). The definition, the initial values and the
    chunked form: the module docstring.

    d_state: real state numbers per channel (even; default 64, the source's); init: 'lin'
    (S4D-Lin) or 'inv' (S4D-Inv); dt_min, dt_max: the range of the initial Delta; chunk_size:
    positions per chunk of the parallel form (>= 1, default 64; any value gives the same
    function)."""

    causal_only = True
    has_scores = False  # no score between two positions: a fixed kernel by distance

    def __init__(
        self,
        head_dim: int,
        n_heads: int,
        d_state: int = 64,
        init: str = "lin",
        dt_min: float = DT_MIN,
        dt_max: float = DT_MAX,
        chunk_size: int = 64,
    ):
        super().__init__(head_dim, n_heads)
        _check_options(d_state, init, dt_min, dt_max, chunk_size)
        self.chunk_size = chunk_size
        self.ssm = DiagonalSSM((n_heads, head_dim), d_state, init, dt_min, dt_max)

    def forward(self, q, k, v, causal: bool = True):
        _check_causal(causal)
        return chunked_s4d(v, self.ssm.params(), self.chunk_size)

    def state_size(self, seq_len: int) -> int:
        """d_state real numbers (d_state / 2 complex) per channel, whatever the length."""
        return self.head_dim * self.ssm.d_state

    def initial_state(self, batch: int, device, dtype: torch.dtype) -> torch.Tensor:
        return self.ssm.initial_state(batch, device, dtype)

    def step(self, state, q, k, v):
        """One position: v (batch, heads, head_dim) through each channel's SSM."""
        return s4d_step(state, v, self.ssm.params())


class S4DLayer(Layer):
    """S4D's block (models/s4/s4d.py ``S4D``): each of the d_model channels through its own
    diagonal SSM with the D skip, GELU, then a position-wise Linear to 2 d_model and a GLU.
    ``n_heads`` is not used (the SSM is per channel). Options as the core's."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_state: int = 64,
        init: str = "lin",
        dt_min: float = DT_MIN,
        dt_max: float = DT_MAX,
        chunk_size: int = 64,
    ):
        super().__init__(d_model, n_heads)
        _check_options(d_state, init, dt_min, dt_max, chunk_size)
        self.chunk_size = chunk_size
        # one "head" of d_model channels: chunked_s4d's (batch, heads, length, channels)
        self.ssm = DiagonalSSM((1, d_model), d_state, init, dt_min, dt_max)
        self.output_linear = nn.Linear(d_model, 2 * d_model)  # its 1 x 1 Conv1d, then GLU

    def _output(self, y: torch.Tensor) -> torch.Tensor:
        return F.glu(self.output_linear(F.gelu(y)), dim=-1)

    def forward(self, x: torch.Tensor, causal: bool = True) -> torch.Tensor:
        self.check_causal(causal)
        y = chunked_s4d(x.unsqueeze(1), self.ssm.params(), self.chunk_size).squeeze(1)
        return self._output(y)

    def initial_state(self, batch: int, device, dtype: torch.dtype) -> torch.Tensor:
        return self.ssm.initial_state(batch, device, dtype)

    def step(self, state, x: torch.Tensor):
        y, state = s4d_step(state, x.unsqueeze(1), self.ssm.params())
        return self._output(y.squeeze(1)), state

    def state_size(self, seq_len: int) -> int:
        """d_state real numbers per channel."""
        return self.d_model * self.ssm.d_state


S4D.layer = S4DLayer
