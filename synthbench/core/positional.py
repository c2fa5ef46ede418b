"""Rotary positional encodings: each head's queries and keys are rotated by their position
before the mechanism sees them (values are not). Documented in docs/POSITIONS.md.

One head's query or key x (head_dim d) at position p becomes R(p) x, with

    R(p) = U [R_2(p w_1) (+) ... (+) R_2(p w_m) (+) I_(d - 2m)] U^T,
    R_2(a) = [[cos a, -sin a], [sin a, cos a]],

R_2(p w_i) acting on the interleaved pair (x_2i, x_2i+1), i.e. the complex number
x_2i + i x_2i+1 times e^(i p w_i). The first 2m = rotate_fraction * d dimensions are
rotated; the other d - 2m pass through unchanged. The blocks commute, so

    R(a) R(b) = R(a + b),    R(p)^T R(s) = R(s - p),

and a score that depends only on q.k, |q| and |k| (softmax, yat, yat-spherical) depends on
the positions only through s - p (Su et al. 2021, RoFormer; the structured form with a
basis U is seed 004, T2.7-T2.9).

- ``rope``: U = I, w_i = base^(-2i / 2m), base 10000: standard RoPE with interleaved pairs
  (the frequencies are spread over the rotated width 2m, not over d).
- ``rope-learned``: w learned per head, initialised at the ``rope`` values.
- ``rope-cayley``: learned w and a learned orthogonal basis U per head, the Cayley transform
  U = (I - S)(I + S)^-1 of the skew-symmetric S = A - A^T (seed 004, T3.1-T3.2: orthogonal,
  det 1, for any A). A is unconstrained and starts at 0, so U = I at initialisation.

For a score of q.k alone U is absorbable into the query and key projections
((U R U^T q).(U R U^T k) = (R U^T q).(R U^T k)); it is applied in full here, so a
mechanism sees a genuine rotation of its inputs whatever its kernel.
"""

from __future__ import annotations

import torch
from torch import nn

from synthbench.core.params import check_positive


def rope_frequencies(rotated_dims: int, base: float) -> torch.Tensor:
    """(rotated_dims / 2,) float64: w_i = base^(-2i / rotated_dims), i = 0, 1, ..."""
    return base ** (-torch.arange(0, rotated_dims, 2, dtype=torch.float64) / rotated_dims)


def cayley(skew: torch.Tensor) -> torch.Tensor:
    """(I - S)(I + S)^-1 for skew-symmetric S (..., d, d): orthogonal with determinant 1.

    I + S is always invertible (the eigenvalues of S are imaginary), and I - S commutes with
    (I + S)^-1, so the product is the solution X of (I + S) X = I - S."""
    eye = torch.eye(skew.shape[-1], dtype=skew.dtype, device=skew.device)
    return torch.linalg.solve(eye + skew, eye - skew)


def rotate_pairs(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Rotate the interleaved pairs (x_2i, x_2i+1) of x (..., 2m) by ``angles`` (..., m): the
    complex numbers x_2i + i x_2i+1 times e^(i angle) (many times faster than the real form
    on a CPU)."""
    pairs = x.unflatten(-1, (-1, 2))
    if pairs.storage_offset() % 2 or any(stride % 2 for stride in pairs.stride()[:-1]):
        pairs = pairs.contiguous()  # a complex view needs even strides
    z = torch.view_as_complex(pairs)
    rotor = torch.polar(torch.ones_like(angles), angles)  # in the angles' precision
    return torch.view_as_real(z * rotor.to(z.dtype)).flatten(-2)


class RoPE(nn.Module):
    """Standard RoPE (``rope``): fixed frequencies base^(-2i / 2m), U = I.

    ``rotate_fraction`` in (0, 1] is the share of the head's dimensions that is rotated; it
    must make an even whole number of them (the rest are left unrotated).
    """

    def __init__(
        self, head_dim: int, n_heads: int, rotate_fraction: float = 1.0, base: float = 10000.0
    ):
        super().__init__()
        check_positive(rotate_fraction=rotate_fraction, base=base)
        rotated = rotate_fraction * head_dim
        if rotate_fraction > 1 or abs(rotated - round(rotated)) > 1e-9 or round(rotated) % 2:
            raise ValueError(
                f"rotate_fraction must be in (0, 1] and rotate an even number of the "
                f"{head_dim} dims of a head, got {rotate_fraction} ({rotated:g} dims)"
            )
        self.head_dim, self.n_heads = head_dim, n_heads
        self.rotate_fraction, self.base = float(rotate_fraction), float(base)
        self.rotated_dims = round(rotated)
        # derived from base, not stored; float64 so that a float64 module matches the formula
        self.register_buffer(
            "fixed_frequencies", rope_frequencies(self.rotated_dims, base), persistent=False
        )

    def frequencies(self) -> torch.Tensor:
        """(n_heads, rotated_dims / 2): the angle per unit of position of each pair."""
        return self.fixed_frequencies.expand(self.n_heads, -1)

    def basis(self, dtype: torch.dtype | None = None) -> torch.Tensor | None:
        """The orthogonal U (n_heads, d, d), or None for U = I."""
        return None

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """x (..., heads, length, head_dim) -> R(p) x; positions p (length,), default 0..L-1."""
        if positions is None:
            positions = torch.arange(x.shape[-2], device=x.device)
        frequencies = self.frequencies()
        angles = positions.to(frequencies)[:, None] * frequencies[:, None, :]  # (H, L, m)
        basis = self.basis()
        if basis is not None:  # x holds row vectors: U^T x is x @ U, one product per head
            basis = basis.to(x.dtype)
            x = torch.einsum("...hld,hde->...hle", x, basis)
        r = self.rotated_dims
        if r == self.head_dim:
            x = rotate_pairs(x, angles)
        else:
            x = torch.cat((rotate_pairs(x[..., :r], angles), x[..., r:]), dim=-1)
        if basis is not None:  # back: U (.)
            x = torch.einsum("...hle,hde->...hld", x, basis)
        return x

    @torch.no_grad()
    def rotation_matrix(self, position: float) -> torch.Tensor:
        """The explicit R(p) (n_heads, d, d), float64, that ``forward`` applies at ``position``."""
        angles = position * self.frequencies().double()  # (H, m)
        cos, sin = angles.cos(), angles.sin()
        even = torch.arange(0, self.rotated_dims, 2)
        matrix = torch.eye(self.head_dim, dtype=torch.float64).repeat(self.n_heads, 1, 1)
        matrix[:, even, even], matrix[:, even, even + 1] = cos, -sin
        matrix[:, even + 1, even], matrix[:, even + 1, even + 1] = sin, cos
        basis = self.basis(torch.float64)
        return matrix if basis is None else basis @ matrix @ basis.transpose(-1, -2)

    def extra_repr(self) -> str:
        return f"rotated_dims={self.rotated_dims}/{self.head_dim}, base={self.base:g}"


class LearnedRoPE(RoPE):
    """``rope-learned``: RoPE whose frequencies are parameters, one set per head,
    initialised at the ``rope`` values."""

    def __init__(
        self, head_dim: int, n_heads: int, rotate_fraction: float = 1.0, base: float = 10000.0
    ):
        super().__init__(head_dim, n_heads, rotate_fraction, base)
        initial = self.fixed_frequencies.to(torch.get_default_dtype()).repeat(n_heads, 1)
        self.learned_frequencies = nn.Parameter(initial)

    def frequencies(self) -> torch.Tensor:
        return self.learned_frequencies


class CayleyRoPE(LearnedRoPE):
    """``rope-cayley``: learned frequencies and a learned basis U = cayley(A - A^T) per head,
    A initialised at 0 (U = I)."""

    def __init__(
        self, head_dim: int, n_heads: int, rotate_fraction: float = 1.0, base: float = 10000.0
    ):
        super().__init__(head_dim, n_heads, rotate_fraction, base)
        self.basis_generator = nn.Parameter(torch.zeros(n_heads, head_dim, head_dim))

    def basis(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        a = self.basis_generator if dtype is None else self.basis_generator.to(dtype)
        return cayley(a - a.transpose(-1, -2))


ROTATIONS: dict[str, type[RoPE]] = {
    "rope": RoPE,
    "rope-learned": LearnedRoPE,
    "rope-cayley": CayleyRoPE,
}
