"""modular: ``x_1 .. x_n SEP y`` with y = (x_1 + .. + x_n) mod p.

Tokens are the residues 0..p-1 and SEP = p; the answer reuses the residue tokens. One
uniform attention head over x puts the mean of the values (or the histogram of residues)
into the residual stream at SEP; since n is fixed, an MLP can scale it to the sum and
reduce it mod p, a periodic function that needs resolution 1/n and does not carry over to
longer inputs. With p = 2 this is parity; without attention the model sees only SEP and is
at chance.
"""

from dataclasses import dataclass

import torch

from synthbench.task import TASKS, Batch, Task, batch_from_parts, require_at_least, targets_at


@dataclass(frozen=True)
class ModularParams:
    n: int = 16  # number of summands
    p: int = 7  # the modulus; residues are 0..p-1

    def __post_init__(self):
        require_at_least("modular", self, n=1, p=2)


@TASKS.register(
    "modular",
    category="Arithmetic",
    description="x SEP y: the sum of x modulo p",
)
class Modular(Task):
    Params = ModularParams
    difficulties = {"easy": {"n": 8}, "hard": {"n": 32, "p": 13}}
    length_param = "n"

    @property
    def special_tokens(self) -> dict[str, int]:
        return {"SEP": self.params.p}

    @property
    def vocab_size(self) -> int:
        return self.params.p + 1

    @property
    def seq_len(self) -> int:
        return self.params.n + 1

    def generate(self, n: int, generator: torch.Generator, device="cpu") -> Batch:
        p, dev = self.params, generator.device
        x = torch.randint(p.p, (n, p.n), generator=generator, device=dev)
        return batch_from_parts([x, self.sep], [x.sum(dim=1, keepdim=True) % p.p], device)

    def solve(self, inputs: torch.Tensor) -> torch.Tensor:
        n, modulus = self.params.n, self.params.p
        # a running sum reduced at every step (a scan, as a recurrent model would do it)
        total = torch.zeros_like(inputs[:, 0])
        for i in range(n):
            total = (total + inputs[:, i]) % modulus
        return targets_at(inputs, n, total)  # the SEP position answers the sum
