"""parity: ``b_1 .. b_n SEP p``. The answer p is the parity of the bits (their sum mod 2).

Tokens are the bits 0 and 1 and SEP = 2; the answer reuses the bit tokens. One uniform
attention head over the bits puts their mean k / n into the residual stream, and an MLP must
then map k to k mod 2: a step function with n steps that needs resolution 1/n and does not
carry over to longer inputs. Parity is the classic case that is hard for transformers
(Hahn 2020); without attention the model sees only SEP and is at chance.
"""

from dataclasses import dataclass

import torch

from synthbench.task import TASKS, Batch, Task, batch_from_parts, require_at_least, targets_at


@dataclass(frozen=True)
class ParityParams:
    n: int = 16  # number of bits

    def __post_init__(self):
        require_at_least("parity", self, n=1)


@TASKS.register("parity", category="Arithmetic", description="b SEP p: the parity of the bits")
class Parity(Task):
    Params = ParityParams
    difficulties = {"easy": {"n": 8}, "hard": {"n": 32}}
    length_param = "n"

    @property
    def special_tokens(self) -> dict[str, int]:
        return {"SEP": 2}

    @property
    def vocab_size(self) -> int:
        return 3

    @property
    def seq_len(self) -> int:
        return self.params.n + 1

    def generate(self, n: int, generator: torch.Generator, device="cpu") -> Batch:
        p, dev = self.params, generator.device
        bits = torch.randint(2, (n, p.n), generator=generator, device=dev)
        return batch_from_parts([bits, self.sep], [bits.sum(dim=1, keepdim=True) % 2], device)

    def solve(self, inputs: torch.Tensor) -> torch.Tensor:
        n = self.params.n
        parity = (inputs[:, :n] == 1).sum(dim=1) % 2
        return targets_at(inputs, n, parity)  # the SEP position answers the parity
