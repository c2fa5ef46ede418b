"""The leak check of one mechanism configuration of a ``run`` (synthbench/integrity/guard.py):
its layout and causality checks at the lengths its runs use, or in the block track the
causality of its published layer. Small and picklable, and importing little, so that it
runs in the child process that plugin code's checks run in (integrity/isolation.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from synthbench.core.interrupts import caught
from synthbench.integrity.causality import CheckResult, Subject, check_leaks, one_thread
from synthbench.integrity.layer_checks import leak_in_layer


@dataclass
class LeakCheck:
    """What ``first_leak`` checks: mechanism ``name`` with ``params``, as a core (each
    Subject, by the ``max_len`` its model tells it, at its lengths) or as its published
    layer of ``d_model`` and ``n_heads`` (at ``layer_lengths``)."""

    name: str
    params: dict[str, Any]
    d_model: int
    n_heads: int
    subjects: list[tuple[Subject, list[int]]] = field(default_factory=list)
    layer_lengths: list[int] = field(default_factory=list)

    def first_leak(self) -> CheckResult | None:
        """The first layout or causality check failed by what the mechanism computed; None
        when it passes every one (or raises: no proof of a leak, training says why)."""
        with one_thread():
            if self.layer_lengths:
                try:
                    leak = leak_in_layer(
                        self.name, self.params, self.d_model, self.n_heads, self.layer_lengths
                    )
                except BaseException as exc:  # raising is no proof of a leak
                    caught(exc)
                    return None
                return None if leak is None else CheckResult("layer-causal", False, leak)
            for subject, lengths in self.subjects:
                for result in check_leaks(subject, lengths):
                    if result.leaks:
                        return result
        return None
