"""modular: ``x_1 .. x_n SEP s_1 .. s_n``, s_i = (x_1 + .. + x_i) mod p: the running sum.

Dense layout (the default): after SEP every prefix sum is an answer, a chain of n steps
(s_i = s_(i-1) + x_i mod p), so the target metric is the free-running token accuracy: the
sum counts as computed only where the model carries its own previous answer. ``dense=False``
is suite v1's one-answer layout ``x SEP y``, y the whole sum mod p.

Tokens are the residues 0..p-1 and SEP = p; the answers reuse the residue tokens.

Known solution (dense): at the position of s_(i-1) (SEP for i = 1) a head attends to x_i,
n + 1 positions back, and the model adds it to the current token mod p: a table of p x p
pairs. The answer is never in a window of the last few tokens: x_i is n + 1 back. In the
one-answer layout, one uniform head over x gives the mean of the values at SEP and an MLP
must reduce the sum mod p, a periodic function of resolution 1/n that an attention-only
model cannot express (suite v1: chance for every mechanism). With p = 2 this is parity.
"""

from dataclasses import dataclass

import torch

from synthbench.core.task import (
    TASKS,
    Batch,
    Ladder,
    Task,
    batch_from_parts,
    require_at_least,
    targets_at,
)


@dataclass(frozen=True)
class ModularParams:
    n: int = 16  # number of summands
    p: int = 7  # the modulus; residues are 0..p-1
    dense: bool = True  # every prefix sum an answer; False: only the whole sum (suite v1)

    def __post_init__(self):
        require_at_least("modular", self, n=1, p=2)


@TASKS.register(
    "modular",
    category="Arithmetic",
    description="x SEP s_1 .. s_n: the running sum of x modulo p",
)
class Modular(Task):
    Params = ModularParams
    difficulties = {"easy": {"n": 8}, "hard": {"n": 32, "p": 13}}
    harder = {"n": "larger", "p": "larger"}  # a longer chain; a p x p addition table
    # State-tracking length: a running sum mod p is the word problem of the cyclic group
    # Z_p, carried one summand at a time (Grazzi et al. 2024; Merrill et al. 2024).
    ladder = Ladder(
        axis=("n",),
        source="Grazzi et al. 2024 (arXiv 2411.12537); Merrill et al. 2024 (arXiv 2404.08819)",
        baseline={"n": 16},
        steps=({"n": 32}, {"n": 64}),
    )
    length_param = "n"

    @property
    def special_tokens(self) -> dict[str, int]:
        return {"SEP": self.params.p}

    @property
    def vocab_size(self) -> int:
        return self.params.p + 1

    @property
    def seq_len(self) -> int:
        return 2 * self.params.n if self.params.dense else self.params.n + 1

    @property
    def target_metric(self) -> str:
        return "free_token_acc" if self.params.dense else "token_acc"

    def generate(self, n: int, generator: torch.Generator, device="cpu") -> Batch:
        p, dev = self.params, generator.device
        x = torch.randint(p.p, (n, p.n), generator=generator, device=dev)
        return running_sum_batch(x, p.p, self.sep, p.dense, device)

    def solve(self, inputs: torch.Tensor) -> torch.Tensor:
        return solve_running_sum(inputs, self.params.n, self.params.p, self.params.dense)


def running_sum_batch(x: torch.Tensor, modulus: int, sep: int, dense: bool, device) -> Batch:
    """``x SEP`` and the prefix sums of x mod ``modulus`` (``dense``) or only the last one."""
    sums = x.cumsum(dim=1) % modulus
    return batch_from_parts([x, sep], [sums if dense else sums[:, -1:]], device)


def solve_running_sum(inputs: torch.Tensor, n: int, modulus: int, dense: bool) -> torch.Tensor:
    """The oracle of :func:`running_sum_batch`: a scan over x, reduced at every step; in the
    dense layout answer i is the running sum after x_(i+1), whatever answers precede it."""
    total = torch.zeros_like(inputs[:, 0])
    sums = []
    for i in range(n):
        total = (total + inputs[:, i]) % modulus
        sums.append(total)
    if not dense:
        return targets_at(inputs, n, total)  # the SEP position answers the sum
    answered = torch.stack(sums, dim=1)[:, : inputs.shape[1] - n]
    return targets_at(inputs, slice(n, n + answered.shape[1]), answered)
