"""stack: emit the value each POP removes from a stack, where it is not the token just read.

Layout ``o_1 v_1 .. o_ops v_ops``: a stream of ``ops`` operations of two tokens each, ``PUSH v``
(push the value v) or ``POP a`` where a is the value popped. The answers are the a of every
POP that follows a POP; a POP right after a PUSH pops the value just read, so its a is given,
not asked (in suite v1 it was asked, and "the token before the POP" scored 0.73). Ops come in
runs: each repeats the one before with probability 0.75 (a PUSH on an empty stack, and the
last op a POP whenever the stack is non-empty), so most POPs follow a POP and reach below
the top of the stack as it was. An example without an asked POP is drawn again. There is no
SEP: the answers are interleaved with the prompt, each computable from the ops before it.
Values are tokens 0..values-1, PUSH is ``values``, POP is ``values + 1``. ``every_pop`` is
suite v1's layout (every POP asked, each op a PUSH with probability 0.5), which the
slay-paper protocol runs.

Known solution: at a POP, attend to the most recent PUSH whose value has not been popped yet
and copy its value. "Not popped yet" is a matter of depth: a counting head gives the stack
depth at every op (pushes minus pops so far), and the wanted PUSH is the latest one that
left the stack at the POP's current depth; a further layer matches that depth and copies the
value token after the PUSH. Without attention a POP knows nothing about the stack.
"""

from dataclasses import dataclass

import torch

from synthbench.core.task import IGNORE, TASKS, Batch, Task, require_at_least, teacher_forced

RUN_PERSISTENCE = 0.75  # probability that an op repeats the one before


@dataclass(frozen=True)
class StackParams:
    ops: int = 16  # operations in the stream
    values: int = 16  # number of value tokens
    every_pop: bool = False  # suite v1: every POP asked, ops drawn independently

    def __post_init__(self):
        # PUSH PUSH POP POP at least (suite v1's PUSH POP)
        require_at_least("stack", self, ops=2 if self.every_pop else 4, values=2)


@TASKS.register(
    "stack",
    category="Reasoning",
    description="PUSH v / POP streams: emit the value each POP after a POP removes",
)
class Stack(Task):
    Params = StackParams
    difficulties = {"easy": {"ops": 8}, "hard": {"ops": 64}}
    harder = {"ops": "larger", "values": "larger"}  # deeper stacks; more values
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
        sequences = torch.empty(n, 2 * self.params.ops, dtype=torch.long, device=generator.device)
        asked = torch.empty_like(sequences, dtype=torch.bool)
        todo = torch.arange(n, device=generator.device)
        while len(todo):  # examples without an asked POP are drawn again
            drawn, drawn_asked = self._draw(len(todo), generator)
            keep = drawn_asked.any(dim=1)
            sequences[todo[keep]], asked[todo[keep]] = drawn[keep], drawn_asked[keep]
            todo = todo[~keep]
        return teacher_forced(sequences, asked).to(device)

    def _draw(self, n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """n op streams and the mask of their asked tokens (the a of a POP after a POP)."""
        p, dev = self.params, generator.device
        rows = torch.arange(n, device=dev)
        stack = torch.zeros(n, p.ops, dtype=torch.long, device=dev)  # depth <= ops - 1 at a push
        depth = torch.zeros(n, dtype=torch.long, device=dev)
        sequences = torch.empty(n, 2 * p.ops, dtype=torch.long, device=dev)
        asked = torch.zeros_like(sequences, dtype=torch.bool)
        was_push = torch.ones(n, dtype=torch.bool, device=dev)
        for i in range(p.ops):
            persistence = 0.5 if p.every_pop else RUN_PERSISTENCE
            repeat = torch.rand(n, generator=generator, device=dev) < persistence
            value = torch.randint(p.values, (n,), generator=generator, device=dev)
            wants_push = repeat == was_push  # the same op again, or the other one
            is_push = depth == 0 if i == p.ops - 1 else wants_push | (depth == 0)
            top = stack[rows, (depth - 1).clamp(min=0)]
            slot = depth.clamp(max=p.ops - 1)
            stack[rows, slot] = torch.where(is_push, value, stack[rows, slot])
            depth += torch.where(is_push, 1, -1)
            sequences[:, 2 * i] = torch.where(is_push, self.push, self.pop)
            sequences[:, 2 * i + 1] = torch.where(is_push, value, top)
            asked[:, 2 * i + 1] = ~is_push & (~was_push | p.every_pop)
            was_push = is_push
        return sequences, asked

    def solve(self, inputs: torch.Tensor) -> torch.Tensor:
        # Re-simulates the stack from the tokens. Even positions hold ops, odd ones operands.
        # On garbage input: a value token where an op should be is a no-op (its operand is
        # skipped); a POP on an empty stack has no answer (IGNORE) and changes nothing; PUSH
        # pushes whatever token follows it, PUSH and POP ids included. A POP is asked when the
        # op token before it is a POP.
        n, L = inputs.shape
        rows = torch.arange(n, device=inputs.device)
        stack = torch.zeros(n, self.params.ops, dtype=torch.long, device=inputs.device)
        depth = torch.zeros(n, dtype=torch.long, device=inputs.device)
        targets = torch.full_like(inputs, IGNORE)
        for i in range(0, L, 2):
            op = inputs[:, i]
            is_pop = (op == self.pop) & (depth > 0)
            after_pop = inputs[:, i - 2] == self.pop if i else torch.zeros_like(is_pop)
            top = stack[rows, (depth - 1).clamp(min=0)]
            targets[:, i] = torch.where(is_pop & (after_pop | self.params.every_pop), top, IGNORE)
            depth -= is_pop.long()
            if i + 1 < L:  # the last op's operand is not an input; nothing follows it
                is_push = op == self.push
                slot = depth.clamp(max=self.params.ops - 1)  # depth < ops: one push per op
                stack[rows, slot] = torch.where(is_push, inputs[:, i + 1], stack[rows, slot])
                depth += is_push.long()
        return targets
