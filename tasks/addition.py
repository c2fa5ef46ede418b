"""addition: ``a_0 .. a_{d-1} + b_0 .. b_{d-1} = s_0 .. s_d``, least significant digit first.

Two d-digit numbers (zero padded) and their sum with d + 1 digits; the answers are the sum
digits. Tokens are the digits 0-9, PLUS = 10 and EQ = 11 (EQ plays SEP). Least significant
digit first makes every answer local: the model emits s_j while reading s_{j-1}, and
s_j = (a_j + b_j + c_j) mod 10 where the carry into digit j is c_j = [s_{j-1} < a_{j-1} +
b_{j-1}] (c_0 = 0). So four fixed-offset lookups (a_j, b_j, a_{j-1}, b_{j-1}: positional
attention) plus the current token suffice; no carry chain has to be traced.
"""

from dataclasses import dataclass

import torch

from synthbench.task import TASKS, Batch, Task, batch_from_parts, require_at_least, targets_at


@dataclass(frozen=True)
class AdditionParams:
    digits: int = 6  # digits of each operand; the sum has digits + 1

    def __post_init__(self):
        require_at_least("addition", self, digits=1)


@TASKS.register(
    "addition",
    category="Arithmetic",
    description="a + b = s: add two numbers, digits least significant first",
)
class Addition(Task):
    Params = AdditionParams
    difficulties = {"easy": {"digits": 3}, "hard": {"digits": 12}}
    length_param = "digits"

    @property
    def plus(self) -> int:
        return 10

    @property
    def eq(self) -> int:
        return 11

    @property
    def special_tokens(self) -> dict[str, int]:
        return {"+": self.plus, "=": self.eq}

    @property
    def vocab_size(self) -> int:
        return 12

    @property
    def seq_len(self) -> int:
        return 3 * self.params.digits + 2

    @property
    def target_metric(self) -> str:
        return "free_token_acc"  # the sum digits are a chain of carries

    def generate(self, n: int, generator: torch.Generator, device="cpu") -> Batch:
        d, dev = self.params.digits, generator.device
        a = torch.randint(10, (n, d), generator=generator, device=dev)
        b = torch.randint(10, (n, d), generator=generator, device=dev)
        s = torch.empty(n, d + 1, dtype=torch.long, device=dev)
        carry = torch.zeros(n, dtype=torch.long, device=dev)
        for j in range(d):  # school addition, one digit position at a time
            total = a[:, j] + b[:, j] + carry
            s[:, j], carry = total % 10, total // 10
        s[:, d] = carry
        return batch_from_parts([a, self.plus, b, self.eq], [s], device)

    def solve(self, inputs: torch.Tensor) -> torch.Tensor:
        # Carry lookahead instead of a carry loop: a position generates a carry when
        # a_k + b_k >= 10 and propagates one when a_k + b_k == 9; the carry into digit j is
        # generated at the last position k < j that does not propagate (none: no carry).
        d = self.params.digits
        a, b = inputs[:, :d], inputs[:, d + 1 : 2 * d + 1]
        pair = a + b
        generates = pair >= 10
        position = torch.arange(d, device=inputs.device).expand_as(pair)
        last_stop = torch.where(pair != 9, position, -1).cummax(dim=1).values  # (n, d)
        carry_out = generates.gather(1, last_stop.clamp(min=0)) & (last_stop >= 0)
        carry_in = torch.cat([torch.zeros_like(carry_out[:, :1]), carry_out], dim=1).long()
        pair = torch.cat([pair, torch.zeros_like(pair[:, :1])], dim=1)  # s_d is the carry
        # EQ and s_0..s_{d-1} answer s_j
        return targets_at(inputs, slice(2 * d + 1, None), (pair + carry_in) % 10)
