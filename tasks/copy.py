"""copy: ``x SEP x``. The answer is the second copy of x.

Data tokens are 0..vocab-1 and SEP is ``vocab``. Read as next-token prediction, the
model at input position n + j must emit x_j, which sits exactly n positions back: an
induction head at a fixed offset solves it, the residual stream alone cannot.
"""

from dataclasses import dataclass

import torch

from synthbench.core.task import (
    TASKS,
    Batch,
    SepTask,
    batch_from_parts,
    require_at_least,
    targets_at,
)


@dataclass(frozen=True)
class CopyParams:
    n: int = 32  # length of x
    vocab: int = 32  # number of data tokens

    def __post_init__(self):
        require_at_least("copy", self, n=1, vocab=2)


@TASKS.register("copy", category="Basic", description="x SEP x: reproduce the sequence")
class Copy(SepTask):
    Params = CopyParams
    # easy: 24 over 64 values; at 16 over 32 the multiset of tokens not yet copied (no
    # order) scored 0.28 against chance 0.03 (suite v3)
    difficulties = {"easy": {"n": 24, "vocab": 64}, "hard": {"n": 64}}
    harder = {"n": "larger", "vocab": "larger"}  # reach back n; more values to carry
    length_param = "n"
    computes = {
        "fixed positions": "each answer is the token a fixed offset back (n + 1; reverse: "
        "a fixed place of x): copying from there is the computation tested"
    }

    @property
    def seq_len(self) -> int:
        return 2 * self.params.n

    def generate(self, n: int, generator: torch.Generator, device="cpu") -> Batch:
        p = self.params
        x = torch.randint(p.vocab, (n, p.n), generator=generator, device=generator.device)
        return batch_from_parts([x, self.sep], [x], device)

    def solve(self, inputs: torch.Tensor) -> torch.Tensor:
        n = self.params.n
        # position i answers x_{i-n}
        return targets_at(inputs, slice(n, None), inputs[:, : inputs.shape[1] - n])
