"""``synthbench bench fidelity``: how closely the SLAY linearisations follow exact spherical
Yat attention (SLAY 001 sec. 3.1, Table 2, Table 6 / App. D and H), how often their
denominators go negative (001 App. L.2, Fig. 7), and the quadrature error of the kernel
against the number of nodes R (001 App. L.3, Fig. 9).

Setup, as in the paper's ablation script: random embeddings x ~ N(0, 1) of shape
(batch, T, d_model), one ``MultiHeadAttention`` layer per variant whose q, k, v and output
projections are those of the exact ``yat-spherical`` layer (tied; PyTorch's default
initialisation, drawn from the seed), causal, float32, no grad. Per seed, new projections,
new x and new random features (the variants' ``seed``). Outputs are compared over the whole
(batch, T, d_model) tensor: relative l2 error |y - y_ref| / |y_ref|, cosine similarity, mean
squared error; latency is the median forward time.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import torch
from torch import nn

from synthbench.bench.common import feature_dim, median_ms, params_json
from synthbench.bench.memory import is_out_of_memory
from synthbench.core.mechanism import MECHANISMS, FeatureMapMechanism, mechanism_params
from synthbench.core.model import MultiHeadAttention
from synthbench.core.text import plural
from synthbench.mechanisms.slay import gauss_laguerre
from synthbench.report.tables import MISSING, Grid


@dataclass(frozen=True)
class Budget:
    """A row block of 001 Table 6: sequence length T, quadrature nodes R, PRF features M,
    polynomial features P."""

    name: str
    seq_len: int
    quad_nodes: int
    prf_features: int
    poly_features: int


BUDGETS = {
    b.name: b
    for b in (
        Budget("small", 128, 2, 8, 8),
        Budget("medium", 256, 2, 16, 16),
        Budget("large", 512, 2, 32, 32),
    )
}
REFERENCE = "yat-spherical"
VARIANTS = (
    "slay-exact-poly",
    "slay",
    "slay-laplace",
    "slay-hadamard",
    "slay-nystrom",
    "slay-tensorsketch",
    "slay-maclaurin",
)
# Without a polynomial factor of their own; under feature matching (the paper's script) they
# get M x P PRF features, as many features as R P M of the others.
MATCHED = ("slay-laplace", "slay-hadamard")

METRICS = [
    ("budget", pa.string()),
    ("seed", pa.int64()),
    ("d_model", pa.int64()),
    ("heads", pa.int64()),
    ("batch", pa.int64()),
    ("quad_nodes", pa.int64()),  # R, M, P as the variant was built (null where it has none)
    ("prf_features", pa.int64()),
    ("poly_features", pa.int64()),
    ("feature_dim", pa.int64()),
    ("eps", pa.float64()),
    ("rel_l2", pa.float64()),
    ("cos", pa.float64()),
    ("mse", pa.float64()),
    ("latency_ms", pa.float64()),
    ("neg_den_frac", pa.float64()),  # share of queries whose causal denominator is < 0
    ("repeats", pa.int64()),
    ("warmup", pa.int64()),
]
QUADRATURE_METRICS = [
    ("quad_nodes", pa.int64()),
    ("eps", pa.float64()),
    ("max_abs_err", pa.float64()),  # over x in [-1, 1]
    ("mean_abs_err", pa.float64()),
    ("max_abs_err_half", pa.float64()),  # over |x| <= 0.5, away from the 1/eps peak at x = 1
    ("median_rel_err", pa.float64()),
]


@dataclass(frozen=True)
class FidelitySetup:
    d_model: int = 64  # the paper's script: embed_dim 64, 4 heads, batch 8
    heads: int = 4
    batch: int = 8
    seeds: int = 5
    seq_len: int | None = None  # None: each budget's T
    eps: float = 1e-3  # the kernel's (all variants and the reference); Table 9
    match_features: bool = True
    repeats: int = 3
    warmup: int = 1
    device: str = "cpu"

    def __post_init__(self) -> None:
        if min(self.d_model, self.heads, self.batch, self.seeds, self.repeats) < 1:
            raise ValueError("--d-model, --heads, --batch, --seeds and --repeats must be >= 1")
        if self.d_model % self.heads:
            raise ValueError(f"--d-model {self.d_model} is not divisible by --heads {self.heads}")
        if self.seq_len is not None and self.seq_len < 1:
            raise ValueError("--seq-len must be >= 1")
        if self.warmup < 0 or not self.eps > 0:
            raise ValueError("--warmup must be >= 0 and --eps > 0")


def variant_params(name: str, budget: Budget, setup: FidelitySetup, seed: int) -> dict:
    """The budget mapped onto the constructor (only the parameters the variant has)."""
    cls = MECHANISMS.get(name)
    defaults = mechanism_params(cls)
    wanted = {
        "quad_nodes": budget.quad_nodes,
        "prf_features": budget.prf_features,
        "poly_features": budget.poly_features,
        "eps": setup.eps,
        "seed": seed,
    }
    if setup.match_features and name in MATCHED:
        wanted["prf_features"] = budget.prf_features * budget.poly_features
    return mechanism_params(cls, {k: v for k, v in wanted.items() if k in defaults})


def denominators(mechanism: nn.Module, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor | None:
    """sum_{j<=i} score(q_i, k_j) per query, what kernel normalisation divides by (before its
    delta), in the precision the mechanism computes in; None for a mechanism without scores
    we can form. Feature maps: phi(q_i) . sum_{j<=i} phi(k_j), linear in L."""
    if isinstance(mechanism, FeatureMapMechanism):
        keys = mechanism.feature_map(k, is_query=False).cumsum(dim=-2)
        return (mechanism.feature_map(q, is_query=True) * keys).sum(-1)
    if hasattr(mechanism, "kernel"):
        return mechanism.kernel(q, k).tril().sum(-1)
    return None


def _forward(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return layer(x)


def _compare(layer, x, y_ref, setup: FidelitySetup) -> dict[str, Any]:
    captured = {}
    hook = layer.mechanism.register_forward_hook(
        lambda module, args, output: captured.update(q=args[0], k=args[1])
    )
    y = _forward(layer, x).double()
    hook.remove()
    with torch.no_grad():
        den = denominators(layer.mechanism, captured["q"], captured["k"])
    diff = y - y_ref
    device = torch.device(setup.device)
    return {
        "status": "ok" if torch.isfinite(y).all() else "nonfinite",
        "rel_l2": (diff.norm() / y_ref.norm()).item(),
        "cos": ((y * y_ref).sum() / (y.norm() * y_ref.norm())).item(),
        "mse": diff.square().mean().item(),
        "neg_den_frac": (den < 0).double().mean().item() if den is not None else None,
        "latency_ms": median_ms(
            functools.partial(_forward, layer, x), device, setup.repeats, setup.warmup
        ),
    }


def _row(name: str, params: dict, budget: Budget, seed: int, seq_len: int, setup, result) -> dict:
    mechanism = result.pop("mechanism", None)
    return {
        "mechanism": name,
        "label": name,
        "params": params_json(params),
        "seq_len": seq_len,
        "error": None,
        **result,
        "budget": budget.name,
        "seed": seed,
        "d_model": setup.d_model,
        "heads": setup.heads,
        "batch": setup.batch,
        "quad_nodes": params.get("quad_nodes"),
        "prf_features": params.get("prf_features"),
        "poly_features": params.get("poly_features"),
        "feature_dim": feature_dim(mechanism),
        "eps": setup.eps,
        "repeats": setup.repeats,
        "warmup": setup.warmup,
    }


def measure(setup: FidelitySetup, budgets: list[Budget], variants: list[str], on_rows) -> None:
    """Every (budget, seed): the reference (error 0, its latency) and every variant with tied
    projections. ``on_rows(rows)`` gets the rows of each (budget, seed) as they come."""
    device = torch.device(setup.device)
    ref_params = mechanism_params(MECHANISMS.get(REFERENCE), {"eps": setup.eps})

    def layer(name: str, params: dict) -> MultiHeadAttention:
        mechanism = MECHANISMS.get(name)(setup.d_model // setup.heads, setup.heads, **params)
        return MultiHeadAttention(setup.d_model, setup.heads, mechanism).to(device)

    for budget in budgets:
        seq_len = setup.seq_len or budget.seq_len
        for seed in range(setup.seeds):
            torch.manual_seed(seed)  # the projections
            reference = layer(REFERENCE, ref_params)
            inputs = torch.Generator().manual_seed(seed)
            x = torch.randn(setup.batch, seq_len, setup.d_model, generator=inputs).to(device)
            y_ref = _forward(reference, x).double()
            rows = []
            for name in [REFERENCE, *variants]:
                params = (
                    variant_params(name, budget, setup, seed) if name in variants else ref_params
                )
                try:
                    variant = layer(name, params)
                    variant.qkv, variant.out = reference.qkv, reference.out  # tied projections
                    result = {**_compare(variant, x, y_ref, setup), "mechanism": variant.mechanism}
                except Exception as exc:  # stored; the other variants go on
                    status = "oom" if is_out_of_memory(exc) else "error"
                    result = {"status": status, "error": f"{type(exc).__name__}: {exc}"[:500]}
                rows.append(_row(name, params, budget, seed, seq_len, setup, result))
            on_rows(rows)


# -- the quadrature error (001 Fig. 9) -------------------------------------------------------


def quadrature_rows(eps: float, max_nodes: int, points: int = 2001) -> list[dict[str, Any]]:
    """The R-node Gauss-Laguerre estimate sum_r w_r x^2 e^(2 s_r x) (what every SLAY variant
    discretises) against the exact x^2 / (C - 2x), C = 2 + eps, over ``points`` x in [-1, 1],
    for R = 1 .. max_nodes."""
    x = np.linspace(-1.0, 1.0, points)
    exact = x**2 / (2.0 + eps - 2.0 * x)  # yat.spherical_yat_kernel as a function of x
    half = np.abs(x) <= 0.5
    rows = []
    for nodes in range(1, max_nodes + 1):
        s, w = gauss_laguerre(nodes, eps)
        estimate = (w * x[:, None] ** 2 * np.exp(2.0 * x[:, None] * s)).sum(axis=1)
        error = np.abs(estimate - exact)
        relative = error[exact > 0] / exact[exact > 0]
        rows.append(
            {
                "mechanism": "slay",
                "label": "gauss-laguerre",
                "params": params_json({"eps": eps, "quad_nodes": nodes, "points": points}),
                "seq_len": None,
                "status": "ok",
                "error": None,
                "quad_nodes": nodes,
                "eps": eps,
                "max_abs_err": float(error.max()),
                "mean_abs_err": float(error.mean()),
                "max_abs_err_half": float(error[half].max()),
                "median_rel_err": float(np.median(relative)),
            }
        )
    return rows


def quadrature_lines(rows: pd.DataFrame) -> list[str]:
    lines = [
        f"quadrature error of x^2 / (C - 2x), eps {rows['eps'].iloc[0]:g}, over x in [-1, 1]:",
        f"{'R':>3} {'max |err|':>11} {'mean |err|':>11} {'max |err|, |x|<=0.5':>20} "
        f"{'median rel. err':>16}",
    ]
    for r in rows.itertuples():
        lines.append(
            f"{r.quad_nodes:>3} {r.max_abs_err:>11.3g} {r.mean_abs_err:>11.3g} "
            f"{r.max_abs_err_half:>20.3g} {r.median_rel_err:>16.3g}"
        )
    return lines


# -- the table (001 Table 6) ----------------------------------------------------------------

COLUMNS = ["T", "R", "M", "P", "features", "rel. l2", "cos", "MSE", "latency (ms)", "neg. den."]
_VALUES = {"rel. l2": "rel_l2", "cos": "cos", "MSE": "mse", "latency (ms)": "latency_ms"}


def _mean_std(values: pd.Series, n_seeds: int) -> str:
    values = values.dropna()
    if values.empty:
        return MISSING
    std = values.std(ddof=1) if len(values) > 1 else 0.0
    text = f"{values.mean():.3g} ± {std:.2g}"
    return text if len(values) >= n_seeds else f"{text} (n={len(values)})"


def _given(value) -> str:
    return "-" if value is None or pd.isna(value) else str(int(value))


def fidelity_grid(rows: pd.DataFrame) -> Grid:
    """Budgets x variants (rows) against the settings and the metrics, mean ± std over seeds
    of the successful runs; a variant with none shows --."""
    n_seeds = int(rows["seed"].nunique())
    order = {name: i for i, name in enumerate(BUDGETS)}
    budgets = sorted(rows["budget"].unique(), key=lambda b: order.get(b, len(order)))
    grid_rows, cells = [], []
    for budget in budgets:
        part = rows[rows["budget"] == budget]
        for label, runs in part.groupby("label", sort=False):
            ok = runs[runs["status"] == "ok"]
            first = runs.iloc[0]
            cells.append(
                [
                    _given(first["seq_len"]),
                    _given(first["quad_nodes"]),
                    _given(first["prf_features"]),
                    _given(first["poly_features"]),
                    _given(first["feature_dim"]),
                    *(_mean_std(ok[_VALUES[c]], n_seeds) for c in COLUMNS[5:9]),
                    _mean_std(ok["neg_den_frac"], n_seeds),
                ]
            )
            grid_rows.append((budget, label))
    first = rows.iloc[0]
    notes = [
        f"Mean ± std over {plural(n_seeds, 'seed')} against exact {REFERENCE} attention "
        "(error 0 by definition); lower rel. l2 and MSE are better.",
        f"Inputs x ~ N(0, 1), batch {first['batch']}, d_model {first['d_model']}, "
        f"{first['heads']} heads; q, k, v and output projections tied to the reference layer; "
        f"kernel eps {first['eps']:g}; device {first['device']}.",
        "latency: median forward time (no grad); neg. den.: share of queries whose causal "
        "denominator sum_j<=i phi(q_i).phi(k_j) is below 0 (001 Fig. 7).",
    ]
    return Grid(
        "Kernel fidelity of the SLAY variants (001 Table 6)",
        ["budget", "method"],
        grid_rows,
        COLUMNS,
        cells,
        n_seeds,
        best=None,
        notes=notes,
    )
