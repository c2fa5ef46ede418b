"""stack: emit the value each POP removes from a stack.

Layout ``o_1 v_1 .. o_ops v_ops``: a stream of ``ops`` operations of two tokens each, ``PUSH v``
(push the value v) or ``POP a`` where a is the value popped, the answer, predicted at the POP.
Each op is a PUSH with probability 0.5, always a PUSH on an empty stack, and the last op is
a POP whenever the stack is non-empty, so every example (ops >= 2) has an answer. There is no
SEP: the answers are interleaved with the prompt, each computable from the ops before it.
Values are tokens 0..values-1, PUSH is ``values``, POP is ``values + 1``.

Known solution: at a POP, attend to the most recent PUSH whose value has not been popped yet
and copy its value. "Not popped yet" is a matter of depth: a counting head gives the stack
depth at every op (pushes minus pops so far), and the wanted PUSH is the latest one that
left the stack at the POP's current depth; a further layer matches that depth and copies the
value token after the PUSH. Without attention a POP knows nothing about the stack.
"""

from dataclasses import dataclass

import torch

from synthbench.task import IGNORE, TASKS, Batch, Task, require_at_least, teacher_forced


@dataclass(frozen=True)
class StackParams:
    ops: int = 16  # operations in the stream
    values: int = 16  # number of value tokens

    def __post_init__(self):
        require_at_least("stack", self, ops=2, values=2)


@TASKS.register(
    "stack",
    category="Reasoning",
    description="PUSH v / POP streams: emit the value each POP removes",
)
class Stack(Task):
    Params = StackParams
    difficulties = {"easy": {"ops": 8}, "hard": {"ops": 64}}
    length_param = "ops"

    @property
    def push(self) -> int:
        return self.params.values

    @property
    def pop(self) -> int:
        return self.params.values + 1

    @property
    def special_tokens(self) -> dict[str, int]:
        return {"PUSH": self.push, "POP": self.pop}

    @property
    def vocab_size(self) -> int:
        return self.params.values + 2

    @property
    def seq_len(self) -> int:
        return 2 * self.params.ops - 1

    def generate(self, n: int, generator: torch.Generator, device="cpu") -> Batch:
        p, dev = self.params, generator.device
        rows = torch.arange(n, device=dev)
        stack = torch.zeros(n, p.ops, dtype=torch.long, device=dev)  # depth <= ops - 1 at a push
        depth = torch.zeros(n, dtype=torch.long, device=dev)
        sequences = torch.empty(n, 2 * p.ops, dtype=torch.long, device=dev)
        for i in range(p.ops):
            coin = torch.rand(n, generator=generator, device=dev) < 0.5
            value = torch.randint(p.values, (n,), generator=generator, device=dev)
            is_push = depth == 0 if i == p.ops - 1 else coin | (depth == 0)
            top = stack[rows, (depth - 1).clamp(min=0)]
            slot = depth.clamp(max=p.ops - 1)
            stack[rows, slot] = torch.where(is_push, value, stack[rows, slot])
            depth += torch.where(is_push, 1, -1)
            sequences[:, 2 * i] = torch.where(is_push, self.push, self.pop)
            sequences[:, 2 * i + 1] = torch.where(is_push, value, top)
        mask = torch.zeros_like(sequences, dtype=torch.bool)
        mask[:, 1::2] = sequences[:, 0::2] == self.pop
        return teacher_forced(sequences, mask).to(device)

    def solve(self, inputs: torch.Tensor) -> torch.Tensor:
        # Re-simulates the stack from the tokens. Even positions hold ops, odd ones operands.
        # On garbage input: a value token where an op should be is a no-op (its operand is
        # skipped); a POP on an empty stack has no answer (IGNORE) and changes nothing; PUSH
        # pushes whatever token follows it, PUSH and POP ids included.
        n, L = inputs.shape
        rows = torch.arange(n, device=inputs.device)
        stack = torch.zeros(n, self.params.ops, dtype=torch.long, device=inputs.device)
        depth = torch.zeros(n, dtype=torch.long, device=inputs.device)
        targets = torch.full_like(inputs, IGNORE)
        for i in range(0, L, 2):
            op = inputs[:, i]
            is_pop = (op == self.pop) & (depth > 0)
            top = stack[rows, (depth - 1).clamp(min=0)]
            targets[:, i] = torch.where(is_pop, top, IGNORE)
            depth -= is_pop.long()
            if i + 1 < L:  # the last op's operand is not an input; nothing follows it
                is_push = op == self.push
                slot = depth.clamp(max=self.params.ops - 1)  # depth < ops: one push per op
                stack[rows, slot] = torch.where(is_push, inputs[:, i + 1], stack[rows, slot])
                depth += is_push.long()
        return targets
