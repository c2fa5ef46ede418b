"""copy: ``x SEP x``. The answer is the second copy of x.

Data tokens are 0..vocab-1 and SEP is ``vocab``. Read as next-token prediction, the
model at input position n + j must emit x_j, which sits exactly n positions back: an
induction head at a fixed offset solves it, the residual stream alone cannot.
"""

from dataclasses import dataclass

import torch

from synthbench.task import IGNORE, TASKS, Batch, Task, teacher_forced


@dataclass(frozen=True)
class CopyParams:
    n: int = 32  # length of x
    vocab: int = 32  # number of data tokens

    def __post_init__(self):
        if self.n < 1 or self.vocab < 2:
            raise ValueError(
                f"copy needs n >= 1 and vocab >= 2, got n={self.n}, vocab={self.vocab}"
            )


@TASKS.register("copy", category="Basic", description="x SEP x: reproduce the sequence")
class Copy(Task):
    Params = CopyParams
    difficulties = {"easy": {"n": 16}, "hard": {"n": 64}}
    length_param = "n"

    @property
    def sep(self) -> int:
        return self.params.vocab

    @property
    def vocab_size(self) -> int:
        return self.params.vocab + 1

    @property
    def seq_len(self) -> int:
        return 2 * self.params.n

    def generate(self, n: int, generator: torch.Generator, device="cpu") -> Batch:
        p = self.params
        x = torch.randint(p.vocab, (n, p.n), generator=generator, device=generator.device)
        sep = torch.full((n, 1), self.sep, dtype=torch.long, device=x.device)
        sequences = torch.cat([x, sep, x], dim=1)
        answer = torch.zeros_like(sequences, dtype=torch.bool)
        answer[:, p.n + 1 :] = True
        return teacher_forced(sequences, answer).to(device)

    def solve(self, inputs: torch.Tensor) -> torch.Tensor:
        n = self.params.n
        targets = torch.full_like(inputs, IGNORE)
        targets[:, n:] = inputs[:, : inputs.shape[1] - n]  # position i answers x_{i-n}
        return targets

    def token_name(self, token: int) -> str:
        return "SEP" if token == self.sep else str(token)
