"""addition: add two numbers column by column, least significant digit first.

Streamed layout (the default, suite v2): ``a_0 .. a_{d-1} + b_0 t_0 b_1 t_1 .. b_{d-1}
t_{d-1}``: the first operand, then the second one digit at a time, each digit b_j followed
by its column total t_j = a_j + b_j + c_j (a token 0..19, the answer), where the carry into
the column is c_j = [t_{j-1} >= 10] (c_0 = 0). The totals are school addition written
out: the sum's digit j is t_j mod 10, its top digit [t_{d-1} >= 10]. The carries make the
totals a chain, so the target metric is free-running. To answer, the model fetches a_j from
the first operand (d + j + 1 positions back from b_j: nothing but its position marks it),
adds the digit just read and the carry of the total read just before it. Within the last 4
tokens every total is uniform over ten values (the audit: chance 0.10, no baseline above
it).

``streamed=False`` is suite v1's layout ``a_0 .. a_{d-1} + b_0 .. b_{d-1} = s_0 .. s_d``,
the answers the d + 1 sum digits, each carry left to the model: s_j = (a_j + b_j + c_j)
mod 10 with c_j = [s_{j-1} < a_{j-1} + b_{j-1}], four operands far back and a sum modulo
10, which no additive readout of an attention-only model expresses (docs/TASKS.md has
the measurements); the slay-paper protocol runs it.

Tokens: digits and totals share the ids 0..19 (a digit is a total below 10); PLUS = 20. In
v1's layout the digits 0-9, PLUS = 10 and EQ = 11.
"""

from dataclasses import dataclass

import torch

from synthbench.core.task import (
    TASKS,
    Batch,
    Ladder,
    Task,
    answered_pairs,
    batch_from_parts,
    require_at_least,
    targets_at,
)


@dataclass(frozen=True)
class AdditionParams:
    digits: int = 6  # digits of each operand
    streamed: bool = True  # suite v2's layout; False: suite v1's (the carries left implicit)

    def __post_init__(self):
        require_at_least("addition", self, digits=1)


@TASKS.register(
    "addition",
    category="Arithmetic",
    description="a + b: add two numbers column by column, least significant digit first",
)
class Addition(Task):
    Params = AdditionParams
    # easy: 4 digits (suite v3: at 3 a whole column's operands fit in an 8-token window)
    difficulties = {"easy": {"digits": 4}, "hard": {"digits": 12}}
    harder = {"digits": "larger"}  # a longer carry chain, a_j further back
    # State tracking over length: a carry is one bit carried column to column, and a
    # fixed-size recurrent state or a fixed depth follows such a chain only so far (Grazzi et
    # al. 2024; Merrill et al. 2024). Linear attention and cosFormer added 32 digits at
    # quick's grown lr (docs/TASKS.md), so the ladder starts past the default's 6.
    ladder = Ladder(
        axis=("digits",),
        source="Grazzi et al. 2024 (arXiv 2411.12537); Merrill et al. 2024 (arXiv 2404.08819)",
        baseline={"digits": 16},
        steps=({"digits": 32}, {"digits": 64}),
    )
    length_param = "digits"

    @property
    def plus(self) -> int:
        return 20 if self.params.streamed else 10

    @property
    def eq(self) -> int:
        """v1's layout only: the sum digits follow it."""
        return 11

    @property
    def special_tokens(self) -> dict[str, int]:
        if self.params.streamed:  # no EQ: the totals stream along the second operand
            return {"+": self.plus}
        return {"+": self.plus, "=": self.eq}

    @property
    def vocab_size(self) -> int:
        return 21 if self.params.streamed else 12

    @property
    def seq_len(self) -> int:
        d = self.params.digits
        return 3 * d if self.params.streamed else 3 * d + 2

    @property
    def target_metric(self) -> str:
        return "free_token_acc"  # a chain of carries, in either layout

    def generate(self, n: int, generator: torch.Generator, device="cpu") -> Batch:
        d, dev = self.params.digits, generator.device
        a = torch.randint(10, (n, d), generator=generator, device=dev)
        b = torch.randint(10, (n, d), generator=generator, device=dev)
        totals = torch.empty(n, d, dtype=torch.long, device=dev)
        carry = torch.zeros(n, dtype=torch.long, device=dev)
        for j in range(d):  # school addition, one column at a time
            totals[:, j] = a[:, j] + b[:, j] + carry
            carry = totals[:, j] // 10
        if self.params.streamed:
            columns, is_total = answered_pairs(b, totals)
            return batch_from_parts([a, self.plus], [columns], device, answer_mask=is_total)
        s = torch.cat([totals % 10, carry.unsqueeze(1)], dim=1)  # d + 1 digits
        return batch_from_parts([a, self.plus, b, self.eq], [s], device)

    def solve(self, inputs: torch.Tensor) -> torch.Tensor:
        d = self.params.digits
        a = inputs[:, :d]
        if self.params.streamed:
            # b_j at d + 1 + 2j; the total before it (read back) carries into its column
            b = inputs[:, d + 1 :: 2]
            before = torch.cat([torch.zeros_like(a[:, :1]), inputs[:, d + 2 :: 2]], dim=1)
            carry = (before[:, : b.shape[1]] >= 10).long()
            return targets_at(inputs, slice(d + 1, None, 2), a + b + carry)
        # Carry lookahead instead of a carry loop: a position generates a carry when
        # a_k + b_k >= 10 and propagates one when a_k + b_k == 9; the carry into digit j is
        # generated at the last position k < j that does not propagate (none: no carry).
        b = inputs[:, d + 1 : 2 * d + 1]
        pair = a + b
        generates = pair >= 10
        position = torch.arange(d, device=inputs.device).expand_as(pair)
        last_stop = torch.where(pair != 9, position, -1).cummax(dim=1).values  # (n, d)
        carry_out = generates.gather(1, last_stop.clamp(min=0)) & (last_stop >= 0)
        carry_in = torch.cat([torch.zeros_like(carry_out[:, :1]), carry_out], dim=1).long()
        pair = torch.cat([pair, torch.zeros_like(pair[:, :1])], dim=1)  # s_d is the carry
        # EQ and s_0..s_{d-1} answer s_j
        return targets_at(inputs, slice(2 * d + 1, None), (pair + carry_in) % 10)
