"""long_copy: copy (``x SEP x``) with a long x, to test reach rather than the copy itself.

The layout, tokens, generator and oracle are those of :class:`tasks.copy.Copy` (data
tokens 0..vocab-1, SEP = ``vocab``); only the defaults and presets differ. The model at
input position n + j emits x_{j+1}, exactly n positions back, so the attention has to
reach across the whole prompt: one head at a fixed offset n solves it, the residual
stream alone (current token and position) cannot.
"""

from dataclasses import dataclass

from synthbench.core.task import TASKS, Ladder, require_at_least

from .copy import Copy, CopyParams


@dataclass(frozen=True)
class LongCopyParams(CopyParams):
    n: int = 128  # length of x
    vocab: int = 32  # number of data tokens

    def __post_init__(self):
        require_at_least("long_copy", self, n=1, vocab=2)  # own message: it names this task


@TASKS.register("long_copy", category="Long-Range", description="x SEP x with a long x")
class LongCopy(Copy):
    Params = LongCopyParams
    difficulties = {"easy": {"n": 64}, "hard": {"n": 256}}
    harder = {"n": "larger", "vocab": "larger"}  # reach back n; more values to carry
    # Copy length against state size (Jelassi et al. 2024, Sec. 2-3): the string outgrows a
    # fixed-size state; attention copies any length it was trained on.
    ladder = Ladder(
        axis=("n",),
        source="Jelassi et al. 2024, Repeat After Me (arXiv 2402.01032), Sec. 2-3",
        baseline={"n": 64},
        steps=({"n": 128}, {"n": 256}),
    )
    length_param = "n"
