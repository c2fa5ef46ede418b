"""mod_counting: ``x_1 .. x_n``, x_i in 0..m-1, and at the position of x_i the answer
s_i = (x_1 + .. + x_i) mod m, the running sum: the word problem of the cyclic group Z_m
(m = 2 is parity).

Tokens are the residues 0..m-1; an answer is a residue too, with the same ids. As in
permutation (tasks/permutation.py, which says why), the answers are labels of the positions
they stand at and never enter the stream (``Task.answers_in_stream`` False): unlike modular
(tasks/modular.py), whose ``x SEP s_1 .. s_n`` lets a model add one x to its own previous
answer, the model here must carry the sum itself.

Known solution: a recurrence whose state turns by x_i / m of a full circle at each step (a
rotation, or for m = 2 a sign flip: a negative eigenvalue, Grazzi et al. 2024). With m = 2
the sum is the count of ones mod 2, so the audit's count tables are the computation there.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from synthbench.core.task import TASKS, Batch, ShortcutRule, Task, require_at_least


@dataclass(frozen=True)
class ModCountingParams:
    m: int = 5  # the modulus; inputs and answers are 0..m-1 (2: parity)
    n: int = 32  # number of summands, every prefix sum an answer

    def __post_init__(self):
        require_at_least("mod_counting", self, m=2, n=1)


@TASKS.register(
    "mod_counting",
    category="State",
    suite="extended",
    description="x_1 .. x_n: at each x_i, the running sum x_1 + .. + x_i modulo m",
)
class ModCounting(Task):
    Params = ModCountingParams
    difficulties = {"easy": {"m": 2}, "hard": {"n": 64}}
    harder = {"m": "larger", "n": "larger"}  # more states; a longer sum
    length_param = "n"
    answers_in_stream = False  # labels at the inputs' positions: never fed back

    @property
    def computes(self) -> dict[str, str]:
        if self.params.m == 2:
            return {"counts": "with m = 2 the sum is the count of ones, mod 2"}
        return {}

    @property
    def vocab_size(self) -> int:
        return self.params.m

    @property
    def seq_len(self) -> int:
        return self.params.n

    def generate(self, n: int, generator: torch.Generator, device="cpu") -> Batch:
        p, dev = self.params, generator.device
        x = torch.randint(p.m, (n, p.n), generator=generator, device=dev)
        return Batch(x, x.cumsum(dim=1) % p.m).to(device)

    def solve(self, inputs: torch.Tensor) -> torch.Tensor:
        """One addition per position, left to right: s_i from s_(i-1) and x_i alone."""
        m = self.params.m
        x = inputs.clamp(0, m - 1)
        total, sums = torch.zeros_like(x[:, 0]), []
        for i in range(x.shape[1]):
            total = (total + x[:, i]) % m
            sums.append(total)
        return torch.stack(sums, dim=1)

    def shortcut_rules(self) -> list[ShortcutRule]:
        m = self.params.m

        def recent(inputs: torch.Tensor) -> torch.Tensor:
            sums = inputs.clamp(0, m - 1).cumsum(dim=1)
            sums[:, 4:] -= sums[:, :-4].clone()  # x_(i-3) + .. + x_i
            return sums % m

        rules = [ShortcutRule("last 4", "the sum of the last 4 summands only", recent)]
        if m > 2:  # with m = 2, counting the nonzero summands is the sum itself

            def count_nonzero(inputs: torch.Tensor) -> torch.Tensor:
                return (inputs != 0).long().cumsum(dim=1) % m

            description = "the number of nonzero summands mod m (a counter for the sum)"
            rules.append(ShortcutRule("count nonzero", description, count_nonzero))
        return rules
