"""distant_match: ``x_1 .. x_n SEP a``, a = YES if x_1 == x_n else NO. One answer.

Data tokens are 0..vocab-1, then SEP = ``vocab``, NO = ``vocab + 1``, YES = ``vocab + 2``.
The classes are balanced: a fair coin per example decides whether x_n is set equal to
x_1 or drawn uniformly from the other vocab - 1 tokens; x_2 .. x_{n-1} are uniform.
The answer is predicted at SEP and compares the two ends of the prompt, n - 1 positions
apart. Two attention layers solve it: a previous-token head brings x_n into SEP; a second
head at SEP queries with x_n and scores the key of position 0 high only when its token
equals x_n, falling back to another key (SEP itself) otherwise, so where the attention
lands tells YES from NO. Without attention the model at SEP sees only SEP and its
position: it is at chance (1/2).
"""

from dataclasses import dataclass

import torch

from synthbench.task import TASKS, Batch, Task, batch_from_parts, require_at_least, targets_at


@dataclass(frozen=True)
class DistantMatchParams:
    n: int = 128  # length of x
    vocab: int = 16  # number of data tokens

    def __post_init__(self):
        require_at_least("distant_match", self, n=2, vocab=2)


@TASKS.register(
    "distant_match",
    category="Long-Range",
    description="x SEP YES/NO: does the last token of x equal the first?",
)
class DistantMatch(Task):
    Params = DistantMatchParams
    difficulties = {"easy": {"n": 32}, "hard": {"n": 512}}
    length_param = "n"

    @property
    def no(self) -> int:
        return self.params.vocab + 1

    @property
    def yes(self) -> int:
        return self.params.vocab + 2

    @property
    def special_tokens(self) -> dict[str, int]:
        return {"SEP": self.params.vocab, "NO": self.no, "YES": self.yes}

    @property
    def vocab_size(self) -> int:
        return self.params.vocab + 3

    @property
    def seq_len(self) -> int:
        return self.params.n + 1

    def generate(self, n: int, generator: torch.Generator, device="cpu") -> Batch:
        p, dev = self.params, generator.device
        x = torch.randint(p.vocab, (n, p.n), generator=generator, device=dev)
        same = torch.rand(n, generator=generator, device=dev) < 0.5
        # a uniform token other than x_1: shift x_1 by 1..vocab-1 around the cycle
        shift = 1 + torch.randint(p.vocab - 1, (n,), generator=generator, device=dev)
        x[:, -1] = torch.where(same, x[:, 0], (x[:, 0] + shift) % p.vocab)
        verdict = torch.where(same, self.yes, self.no).unsqueeze(1)
        return batch_from_parts([x, self.sep], [verdict], device)

    def solve(self, inputs: torch.Tensor) -> torch.Tensor:
        n = self.params.n
        match = inputs[:, 0] == inputs[:, n - 1]
        return targets_at(inputs, n, torch.where(match, self.yes, self.no))  # SEP: the verdict
