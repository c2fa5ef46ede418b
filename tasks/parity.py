"""parity: ``b_1 .. b_n SEP p_1 .. p_n``, p_i the parity of b_1 .. b_i: the running parity.

Dense layout (the default): after SEP every prefix parity is an answer, a chain of n steps
(p_i = p_(i-1) xor b_i), so the target metric is the free-running token accuracy.
``dense=False`` is suite v1's one-answer layout ``b SEP p``, p the parity of all the bits.
It is modular's layout with p = 2 (tasks/modular.py).

Tokens are the bits 0 and 1 and SEP = 2; the answers reuse the bit tokens.

Known solution (dense): at the position of p_(i-1) (SEP for i = 1) a head attends to b_i,
n + 1 positions back, and the model takes the xor with the current token. In the one-answer
layout one uniform head over the bits gives their mean k / n and an MLP must map k to
k mod 2, a step function with n steps that an attention-only model cannot express (suite v1:
chance for every mechanism), the classic case that is hard for transformers (Hahn 2020).
Without attention the model sees only its current token and position.
"""

from dataclasses import dataclass

import torch

from synthbench.core.task import TASKS, Batch, Ladder, Task, require_at_least
from synthbench.tasks.modular import running_sum_batch, solve_running_sum


@dataclass(frozen=True)
class ParityParams:
    # 32 bits: a chain long enough that cosFormer's free-running chains break (quick, seeds
    # 0-2: softmax 0.97, linear 0.97, cosFormer 0.90; at 16 bits all three reach 0.97-0.98)
    n: int = 32  # number of bits
    dense: bool = True  # every prefix parity an answer; False: only the whole (suite v1)

    def __post_init__(self):
        require_at_least("parity", self, n=1)


@TASKS.register(
    "parity",
    category="Arithmetic",
    description="b SEP p_1 .. p_n: the running parity of the bits",
)
class Parity(Task):
    Params = ParityParams
    difficulties = {"easy": {"n": 16}, "hard": {"n": 64}}
    harder = {"n": "larger"}  # a longer chain of xors, each b_i n + 1 back
    # State-tracking length: parity is the word problem of Z_2; a linear RNN needs a
    # negative eigenvalue to carry it at any length (Grazzi et al. 2024), and chains of more
    # bits break more often free-running (docs/TASKS.md, "Why 32 bits").
    ladder = Ladder(
        axis=("n",),
        source="Grazzi et al. 2024 (arXiv 2411.12537), parity; Merrill et al. 2024",
        baseline={"n": 32},
        steps=({"n": 64}, {"n": 128}),
    )
    length_param = "n"

    @property
    def special_tokens(self) -> dict[str, int]:
        return {"SEP": 2}

    @property
    def vocab_size(self) -> int:
        return 3

    @property
    def seq_len(self) -> int:
        return 2 * self.params.n if self.params.dense else self.params.n + 1

    @property
    def target_metric(self) -> str:
        return "free_token_acc" if self.params.dense else "token_acc"

    def generate(self, n: int, generator: torch.Generator, device="cpu") -> Batch:
        bits = torch.randint(2, (n, self.params.n), generator=generator, device=generator.device)
        return running_sum_batch(bits, 2, self.sep, self.params.dense, device)

    def solve(self, inputs: torch.Tensor) -> torch.Tensor:
        # a bit is a 1 only as the token 1 (garbage elsewhere counts as 0)
        bits = torch.where(inputs == 1, 1, 0)
        targets = solve_running_sum(bits, self.params.n, 2, self.params.dense)
        return targets
