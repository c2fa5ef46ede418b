"""The contract of a published layer (``synthbench check --track block``): what the block
track needs of a whole mixer (synthbench/core/layer.py), as contract.py asks of a core.

- **layer-causal** (also the leak guard of ``run`` in the block track): in float64, changing
  the input at positions >= t leaves every output before t unchanged (up to
  ``CAUSAL_TOLERANCE`` of the scale), at several t of every length, and changing one example
  leaves another's outputs unchanged.
- **layer-recurrent**: token by token (``step``) the layer gives ``forward``'s outputs, in
  float64, within ``RECURRENT_TOLERANCE`` of the output's scale, at ``RECURRENT_LENGTHS`` and
  the shortest length given.
- **layer-gradients**: in float32 at the longest length, the backward gives every parameter
  a finite gradient.
- **layer-determinism**: the same seed before construction and call gives a bit-identical
  output twice.
- **layer-state-size**: ``state_size(L)`` is an int >= 0 that does not grow with L for a
  mechanism registered as linear.

Every check leaves torch's global random state as it found it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from synthbench.core.interrupts import caught, describe
from synthbench.core.layer import Layer, recurrent_layer_forward
from synthbench.core.mechanism import MECHANISMS, mixer
from synthbench.integrity.causality import SEED, CheckResult, own_random_state, seed_torch

RECURRENT_LENGTHS = (1, 5, 37)
RECURRENT_TOLERANCE = 1e-9  # of the output's scale, in float64
CAUSAL_TOLERANCE = 1e-12


def _build(name: str, params: dict, d_model: int, n_heads: int, dtype) -> Layer:
    seed_torch(SEED)
    layer = mixer(name, d_model, n_heads, "block").build(params)
    return layer.to(dtype).eval()


def _inputs(length: int, d_model: int, dtype, seed: int = SEED) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, length, d_model, generator=g).to(dtype)


def _run(check: str, body: Callable[[], str | None], passed: str) -> CheckResult:
    try:
        problem = body()
    except BaseException as exc:  # a layer that raises fails its check, in one line
        return CheckResult(check, False, f"raised {describe(caught(exc))}", raised=True)
    return CheckResult(check, problem is None, problem or passed)


def leak_in_layer(
    name: str, params: dict, d_model: int, n_heads: int, lengths: Sequence[int]
) -> str | None:
    """What shows mechanism ``name``'s published layer seeing a later position or another
    batch item, in float64 at each of ``lengths`` (several cuts each), or None."""
    f64 = torch.float64
    layer = _build(name, params, d_model, n_heads, f64)
    for length in sorted(set(lengths)):
        x = _inputs(length, d_model, f64)
        with torch.no_grad():
            base = layer(x)
            scale = max(float(base.abs().max()), 1.0)
            mixed = x.clone()
            mixed[1] = _inputs(length, d_model, f64, seed=SEED + 7)[1]
            moved = float((layer(mixed)[0] - base[0]).abs().max())
            if not moved <= CAUSAL_TOLERANCE * scale:
                return f"length {length}: an example's outputs moved by {moved:.2g} with another's"
            for t in sorted({length // 3, length // 2, length - 1} - {0}):
                changed = x.clone()
                changed[:, t:] = _inputs(length - t, d_model, f64, seed=SEED + 1 + t)
                moved = float((layer(changed)[:, :t] - base[:, :t]).abs().max())
                if not moved <= CAUSAL_TOLERANCE * scale:
                    return f"length {length}: outputs before position {t} moved by {moved:.2g}"
    return None


def check_layer(
    name: str, params: dict, d_model: int, n_heads: int, lengths: Sequence[int]
) -> list[CheckResult]:
    """Every check of the module docstring on mechanism ``name``'s published layer."""
    lengths = sorted(set(lengths))
    longest = lengths[-1]
    f64 = torch.float64

    def causal() -> str | None:
        return leak_in_layer(name, params, d_model, n_heads, lengths)

    checked = sorted({*RECURRENT_LENGTHS, lengths[0]})

    def recurrent() -> str | None:
        layer = _build(name, params, d_model, n_heads, f64)
        for length in checked:
            x = _inputs(length, d_model, f64)
            with torch.no_grad():
                parallel, stepped = layer(x), recurrent_layer_forward(layer, x)
            scale = max(float(parallel.abs().max()), 1.0)
            error = float((stepped - parallel).abs().max())
            if not error <= RECURRENT_TOLERANCE * scale:
                return f"length {length}: step by step differs from forward by {error:.2g}"
        return None

    def gradients() -> str | None:
        layer = _build(name, params, d_model, n_heads, torch.float32).train()
        layer(_inputs(longest, d_model, torch.float32)).square().mean().backward()
        bad = [n for n, p in layer.named_parameters() if p.requires_grad and
               (p.grad is None or not torch.isfinite(p.grad).all())]  # fmt: skip
        return f"no finite gradient for {', '.join(bad[:4])}" if bad else None

    def determinism() -> str | None:
        outs = []
        for _ in range(2):
            layer = _build(name, params, d_model, n_heads, torch.float32)
            seed_torch(SEED)
            with torch.no_grad():
                outs.append(layer(_inputs(longest, d_model, torch.float32)))
        return None if torch.equal(*outs) else "two builds with one seed differ"

    def state_size() -> str | None:
        layer = _build(name, params, d_model, n_heads, torch.float32)
        sizes = [layer.state_size(n) for n in lengths]
        if any(not isinstance(s, int) or s < 0 for s in sizes):
            return f"state_size gave {sizes[:3]}, not ints >= 0"
        linear = MECHANISMS.entry(name).metadata.get("complexity") == "linear"
        if linear and len(set(sizes)) > 1:
            return f"a linear mechanism's state grows with the length: {sizes[0]} .. {sizes[-1]}"
        return None

    with own_random_state(torch.device("cpu")):
        return [
            _run(
                "layer-causal",
                causal,
                "no output sees a later input or another example "
                f"(float64, {len(lengths)} lengths {lengths[0]}..{longest})",
            ),  # fmt: skip
            _run(
                "layer-recurrent",
                recurrent,
                "step-by-step outputs equal forward's (float64; "
                f"lengths {', '.join(map(str, checked))})",
            ),  # fmt: skip
            _run("layer-gradients", gradients, "every parameter gets a finite gradient"),
            _run("layer-determinism", determinism, "bit-identical twice with one seed"),
            _run("layer-state-size", state_size, "an int >= 0, as the mechanism's complexity says"),
        ]
