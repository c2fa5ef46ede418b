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
    Ladder,
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
    # Copy against state size: a fixed-size state copies strings only up to what it holds,
    # n log(vocab) bits (Jelassi et al. 2024, Sec. 2-3); here the bits per token grow at a
    # fixed length (long_copy grows the length). Linear attention copied 64 tokens over 512
    # values at quick's grown lr (docs/TASKS.md).
    ladder = Ladder(
        axis=("vocab",),
        source="Jelassi et al. 2024, Repeat After Me (arXiv 2402.01032), Sec. 2-3",
        baseline={"n": 64, "vocab": 32},
        steps=({"vocab": 256}, {"vocab": 2048}),
    )
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
