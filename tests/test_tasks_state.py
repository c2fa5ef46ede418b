"""The State tasks, permutation and mod_counting: their answers against plain-Python
references written apart from the generators, the oracle and its causality, determinism,
parameter validation, the task sets (``--task all`` and ``extended``), the audit, the
free-running evaluation of labels that never enter the stream, and one smoke training."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from test_tasks import check_batch, generator

from synthbench.cli.common import UsageError, select_tasks
from synthbench.core.task import TASKS, Batch, in_default_suite, task_set
from synthbench.integrity import audit
from synthbench.run.evaluation import held_out_metrics
from synthbench.run.protocols import PROTOCOLS
from synthbench.run.runner import run_sweep
from synthbench.run.spec import RunSpec

pytestmark = pytest.mark.usefixtures("single_thread")

GROUPS = ("S3", "S5", "A5", "Z5")
MODULI = (2, 3, 5, 7)
N = 64


# -- plain-Python references ----------------------------------------------------------------


def sign(perm: tuple[int, ...]) -> int:
    """+1 or -1, from the cycle count: (-1) ** (degree - cycles)."""
    seen, cycles = set(), 0
    for start in range(len(perm)):
        if start not in seen:
            cycles += 1
            x = start
            while x not in seen:
                seen.add(x)
                x = perm[x]
    return (-1) ** (len(perm) - cycles)


def reference_elements(group: str) -> list[tuple[int, ...]]:
    """The group's permutations in the documented token order, built without the task's
    code: S_k in lexicographic order, A5 its even members, Z5 the powers of (1 2 3 4 0)."""
    if group == "Z5":
        return [tuple((x + k) % 5 for x in range(5)) for k in range(5)]
    degree = int(group[1:])
    every = sorted(itertools.product(range(degree), repeat=degree))
    perms = [p for p in every if len(set(p)) == degree]
    return [p for p in perms if group[0] == "S" or sign(p) == 1]


def compose(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """a ∘ b: apply b, then a."""
    return tuple(a[b[x]] for x in range(len(b)))


def reference_products(group: str, word: list[int]) -> list[int]:
    members = reference_elements(group)
    product, out = tuple(range(len(members[0]))), []
    for token in word:
        product = compose(product, members[token])  # p_i = p_(i-1) ∘ g_i
        out.append(members.index(product))
    return out


def reference_sums(m: int, word: list[int]) -> list[int]:
    total, out = 0, []
    for x in word:
        total += x
        out.append(total % m)
    return out


def state_tasks():
    return [TASKS.get("permutation")(group=g, n=12) for g in GROUPS] + [
        TASKS.get("mod_counting")(m=m, n=12) for m in MODULI
    ]


# -- the answers ----------------------------------------------------------------------------


@pytest.mark.parametrize("group", GROUPS)
def test_permutation_against_composed_tuples(group):
    task = TASKS.get("permutation")(group=group, n=20)
    assert task.vocab_size == {"S3": 6, "S5": 120, "A5": 60, "Z5": 5}[group]
    assert task.seq_len == 20 and task.answers_in_stream is False
    batch = task.generate(N, generator(0))
    check_batch(task, batch, N)
    for word, target in zip(batch.inputs.tolist(), batch.targets.tolist(), strict=True):
        assert target == reference_products(group, word)
    ids = [task.token_name(i) for i in range(task.vocab_size)]
    assert ids == ["".join(map(str, p)) for p in reference_elements(group)]


def test_the_composition_order_is_the_documented_one():
    """In S3, g_1 = (1 0 2), g_2 = (1 2 0): p_2 = g_1 ∘ g_2 = (0 2 1), not g_2 ∘ g_1."""
    task = TASKS.get("permutation")(group="S3", n=2)
    word = torch.tensor([[task.token_name(i) for i in range(6)].index(t) for t in ("102", "120")])
    assert task.token_name(task.solve(word.unsqueeze(0))[0, 1].item()) == "021"


@pytest.mark.parametrize("m", MODULI)
def test_mod_counting_against_python_sums(m):
    task = TASKS.get("mod_counting")(m=m, n=40)
    assert task.vocab_size == m and task.seq_len == 40 and task.answers_in_stream is False
    batch = task.generate(N, generator(1))
    check_batch(task, batch, N)
    for word, target in zip(batch.inputs.tolist(), batch.targets.tolist(), strict=True):
        assert target == reference_sums(m, word)


@pytest.mark.parametrize("task", state_tasks(), ids=lambda t: str(t.param_dict()))
def test_every_position_answers_and_the_answers_are_not_in_the_stream(task):
    batch = task.generate(N, generator(2))
    assert bool(batch.answer_mask.all())  # dense: an answer at every step
    assert torch.equal(task.solve(batch.inputs), batch.targets)
    # the stream holds the inputs alone: no answer is the next token (it would be at chance)
    agree = (batch.inputs[:, 1:] == batch.targets[:, :-1]).float().mean().item()
    assert agree < 0.5 + 3 / math.sqrt(batch.targets.numel())


@pytest.mark.parametrize("task", state_tasks(), ids=lambda t: str(t.param_dict()))
def test_a_later_token_never_changes_an_earlier_answer(task):
    inputs = task.generate(N, generator(3)).inputs
    solved = task.solve(inputs)
    g = generator(4)
    for t in range(task.seq_len):
        changed = inputs.clone()
        changed[:, t:] = torch.randint(task.vocab_size, changed[:, t:].shape, generator=g)
        assert torch.equal(task.solve(changed)[:, :t], solved[:, :t]), t


@pytest.mark.parametrize("task", state_tasks(), ids=lambda t: str(t.param_dict()))
def test_generation_is_deterministic_from_its_generator(task):
    torch.manual_seed(7)
    state = torch.get_rng_state()
    first, again, other = (task.generate(16, generator(s)) for s in (5, 5, 6))
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(first.inputs, again.inputs) and torch.equal(first.targets, again.targets)
    assert not torch.equal(first.inputs, other.inputs)


def test_a_longer_task_keeps_the_ids():
    task = TASKS.get("permutation")(group="A5", n=8)
    longer = task.at_length(2)
    assert longer.seq_len == 16 and longer.vocab_size == task.vocab_size


# -- parameters -----------------------------------------------------------------------------


def test_an_unknown_group_is_one_line_listing_the_groups():
    with pytest.raises(ValueError) as raised:
        TASKS.get("permutation")(group="S4")
    message = str(raised.value)
    assert "\n" not in message
    assert message == "permutation has no group 'S4' (groups: S3, S5, A5, Z5)"


def test_a_group_name_in_any_case_is_the_canonical_one():
    assert TASKS.get("permutation")(group="a5").params.group == "A5"


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("permutation", {"n": 0}, "permutation needs n >= 1, got n=0"),
        ("mod_counting", {"n": 0}, "mod_counting needs m >= 2 and n >= 1, got m=5, n=0"),
        ("mod_counting", {"m": 1}, "mod_counting needs m >= 2 and n >= 1, got m=1, n=32"),
    ],
)
def test_invalid_params_are_refused(name, params, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        TASKS.get(name)(**params)


# -- the task sets --------------------------------------------------------------------------


def test_all_is_the_22_tasks_and_extended_adds_the_state_tasks():
    suite, extended = select_tasks("all", None), select_tasks("extended", None)
    assert len(suite) == 22 and "permutation" not in suite and "mod_counting" not in suite
    assert sorted(set(extended) - set(suite)) == ["mod_counting", "permutation"]
    assert len(extended) == 24 and task_set("extended") == TASKS.names()
    assert select_tasks("all", "State") == ["mod_counting", "permutation"]
    assert select_tasks("extended", "state") == ["mod_counting", "permutation"]
    with pytest.raises(UsageError, match="no task matches"):
        select_tasks("copy", "State")
    for name in ("permutation", "mod_counting"):
        entry = TASKS.entry(name)
        assert entry.metadata["category"] == "State" and not in_default_suite(entry)
    with pytest.raises(ValueError, match="unknown task set 'some'"):
        task_set("some")


# -- the audit ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "params"),
    [("permutation", {"group": g}) for g in GROUPS] + [("mod_counting", {"m": m}) for m in (2, 3)],
)
def test_the_audit_finds_no_shortcut(name, params):
    """Every generic family and the task's own rules within chance + MARGIN (mod_counting's
    count tables at m = 2 are the computation itself: the count of ones)."""
    result = audit.audit(name, train_answers=100_000, test_answers=20_000, **params)
    assert result.passed and not result.shortcuts, result.findings()
    rules = [b for b in result.baselines if b.family == "task's rules"]
    assert rules and all(b.score <= result.chance + audit.MARGIN for b in rules)


def test_the_order_ignored_rule_solves_only_the_abelian_group():
    """Composing in the wrong order is right in Z5 (so it is no rule there) and near chance
    in S5."""
    s5 = TASKS.get("permutation")(group="S5", n=16)
    (rule,) = [r for r in s5.shortcut_rules() if r.name == "order ignored"]
    batch = s5.generate(256, generator(8))
    right = (rule.predict(batch.inputs) == batch.targets)[:, 4:].float().mean().item()
    assert right < 0.05
    z5 = TASKS.get("permutation")(group="Z5")
    assert [r.name for r in z5.shortcut_rules()] == ["last 4"]


# -- evaluation: labels are never fed back -------------------------------------------------


class _CurrentToken(torch.nn.Module):
    """A causal stand-in for a model: predicts the token it reads plus one, mod ``vocab``,
    so a prediction written back into the stream would change the next one. Counts passes."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab, self.passes = vocab, 0

    def forward(self, x):
        self.passes += 1
        return torch.nn.functional.one_hot((x + 1) % self.vocab, self.vocab).float()


def test_free_running_does_not_overwrite_the_inputs_of_a_label_task():
    task = TASKS.get("mod_counting")(m=5, n=12)
    data = task.generate(32, generator(9))
    inputs = data.inputs.clone()
    model = _CurrentToken(5)
    got = held_out_metrics(model, data, batch_size=64, feed_back=False)
    assert model.passes == 1 and torch.equal(data.inputs, inputs)
    assert got["free_token_acc"] == got["token_acc"]
    fed = held_out_metrics(model, Batch(data.inputs, data.targets), 64)  # the default: fed back
    assert fed["free_token_acc"] != fed["token_acc"]  # what the flag keeps from happening
    assert fed["token_acc"] == got["token_acc"]


def test_one_smoke_training_runs():
    spec = RunSpec.resolve("permutation", "softmax", PROTOCOLS.get("smoke"), 0, {"n": 8})
    rows = run_sweep(spec, torch.device("cpu"))
    row = next(r for r in rows if r["selected"])
    assert row["status"] == "ok", row.get("error")
    assert row["category"] == "State" and row["target_metric"] == "token_acc"
    assert row["free_token_acc"] == row["token_acc"]  # nothing fed back
    assert 0.0 <= row["token_acc"] <= 1.0 and row["n_params"] > 0
    assert row["chance_token_acc"] == pytest.approx(1 / 120, abs=0.01)
