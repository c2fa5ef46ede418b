"""synthbench facts: the rules decide as declared, the built-in facts are well formed, and a
plugin's fact runs, is judged from the stored rows and reported end to end."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import torch
from clitools import assert_error, invoke

from synthbench.core.task import IGNORE, TASKS
from synthbench.facts import (
    FACTS,
    All,
    Arm,
    AtLeast,
    AtMost,
    Better,
    Close,
    Fact,
    Given,
    Precondition,
)
from synthbench.facts import shipped as facts_shipped
from synthbench.facts.builtin import MQAR16, S3_LEARNED
from synthbench.facts.evaluate import decide, fact_specs
from synthbench.facts.report import counts_line, to_markdown
from synthbench.facts.rules import (
    INCONCLUSIVE,
    NOT_REPRODUCED,
    REPRODUCED,
    ArmResult,
)
from synthbench.report import reference
from synthbench.run.store import ResultStore

REPO = Path(__file__).resolve().parents[1]


def arm(*values, se=0.01, edge=False, problem=None) -> ArmResult:
    seeds = range(len(values))
    return ArmResult(
        pd.Series(values, index=seeds, dtype=float),
        pd.Series(se, index=seeds, dtype=float),
        lr_edge=edge,
        problem=problem,
    )


# -- rules ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "a, b, verdict",
    [
        ((0.9, 0.95, 0.92), (0.5, 0.6, 0.4), REPRODUCED),
        ((0.52, 0.55, 0.51), (0.5, 0.5, 0.5), NOT_REPRODUCED),  # below the effect 0.1
        ((0.5, 0.5, 0.5), (0.9, 0.9, 0.9), NOT_REPRODUCED),  # the other way round
        ((0.9, 0.45, 0.9), (0.5, 0.5, 0.5), INCONCLUSIVE),  # a seed's difference is negative
        ((0.9,), (0.5,), INCONCLUSIVE),  # one seed
        # the mean (+0.28) clears the effect, seed 2 (+0.05) does not
        ((0.9, 0.9, 0.55), (0.5, 0.5, 0.5), INCONCLUSIVE),
        ((0.6, 0.6, 0.6), (0.5, 0.5, 0.5), REPRODUCED),  # every seed exactly at the effect
    ],
)
def test_better_decides_on_the_mean_and_every_seed(a, b, verdict):
    decision = Better("a", "b", 0.1).decide({"a": arm(*a, se=0.001), "b": arm(*b, se=0.001)})
    assert decision.verdict == verdict, decision


def test_better_needs_every_seed_to_clear_the_effect_and_names_those_that_do_not():
    results = {"a": arm(0.9, 0.62, 0.95, 0.65), "b": arm(0.5, 0.5, 0.5, 0.5)}
    decision = Better("a", "b", 0.2).decide(results)  # mean +0.28; seeds 1 and 3 below 0.2
    assert decision.verdict == INCONCLUSIVE
    assert "below 0.2 (seed 1 +0.120, seed 3 +0.150)" in decision.reason
    assert "+0.280 over 4 seeds" in decision.figures
    assert "on every one of" in Better("a", "b", 0.2).declaration()


def test_better_is_inconclusive_where_seeds_are_missing():
    """Seeds one arm lacks are no evidence: fewer than two in common, inconclusive."""
    lacking = ArmResult(pd.Series([0.9], index=[2]), pd.Series([0.01], index=[2]))
    decision = Better("a", "b", 0.1).decide({"a": arm(0.9, 0.9, 0.9), "b": lacking})
    assert decision.verdict == INCONCLUSIVE and "common seeds" in decision.reason


def test_better_is_inconclusive_within_the_test_noise():
    # differences of 0.2, each within 2 standard errors (se 0.1 per arm: 2 * 0.141)
    results = {"a": arm(0.7, 0.7, 0.7, se=0.1), "b": arm(0.5, 0.5, 0.5, se=0.1)}
    decision = Better("a", "b", 0.1).decide(results)
    assert decision.verdict == INCONCLUSIVE and "SE" in decision.reason


def test_an_arm_with_failed_runs_or_an_lr_at_the_edge_is_inconclusive_with_the_reason():
    failed = {"a": arm(problem="2 of 3 runs failed (diverged, copy seed 1)"), "b": arm(0.1, 0.1)}
    decision = Better("a", "b").decide(failed)
    assert decision.verdict == INCONCLUSIVE and "diverged" in decision.reason
    edge = {"a": arm(0.9, 0.9, edge=True), "b": arm(0.1, 0.1)}
    assert "edge" in Better("a", "b").decide(edge).reason


@pytest.mark.parametrize(
    "a, b, verdict",
    [
        ((0.98, 0.99), (0.97, 0.99), REPRODUCED),
        ((0.98, 0.99), (0.5, 0.6), NOT_REPRODUCED),
        ((0.98, 0.5), (0.5, 0.98), REPRODUCED),  # the mean difference is 0
        ((0.98, 0.5), (0.5, 0.7), INCONCLUSIVE),  # a gap one seed does not show
    ],
)
def test_close(a, b, verdict):
    assert Close("a", "b", 0.05).decide({"a": arm(*a), "b": arm(*b)}).verdict == verdict


def test_thresholds_and_all():
    results = {"a": arm(0.95, 0.92, 0.91), "b": arm(0.1, 0.05, 0.12)}
    assert AtLeast("a", 0.9).decide(results).verdict == REPRODUCED
    assert AtLeast("b", 0.9).decide(results).verdict == NOT_REPRODUCED
    assert AtMost("b", 0.2).decide(results).verdict == REPRODUCED
    both = All((AtLeast("a", 0.9), AtMost("b", 0.2)))
    assert both.decide(results).verdict == REPRODUCED
    one_fails = All((AtLeast("a", 0.9), AtLeast("b", 0.9)))
    assert one_fails.decide(results).verdict == NOT_REPRODUCED
    unsure = {**results, "c": arm(problem="not run yet")}
    assert All((AtLeast("a", 0.9), AtLeast("c", 0.5))).decide(unsure).verdict == INCONCLUSIVE
    assert set(both.arms()) == {"a", "b"}


def test_given_decides_only_where_its_precondition_holds():
    learned = {"a": arm(0.95, 0.97, 0.96), "b": arm(0.92, 0.94, 0.99)}
    far = {"a far": arm(0.9, 0.85, 0.95), "b far": arm(0.2, 0.1, 0.3)}
    rule = Given(All((AtLeast("a", 0.9), AtLeast("b", 0.9))), Better("a far", "b far", 0.2))
    assert set(rule.arms()) == {"a", "b", "a far", "b far"}
    assert rule.decide({**learned, **far}).verdict == REPRODUCED
    same_far = {"a far": arm(0.9, 0.85, 0.95), "b far": arm(0.9, 0.85, 0.95)}
    assert rule.decide({**learned, **same_far}).verdict == NOT_REPRODUCED
    # b never learned the task: its failure far away says nothing, whatever the gap there
    unlearned = {**learned, "b": arm(0.1, 0.1, 0.1), **far}
    decision = rule.decide(unlearned)
    assert decision.verdict == INCONCLUSIVE and "precondition not met" in decision.reason
    assert "b 0.100" in decision.figures and "a far" in decision.figures  # both figures
    unsure = {**learned, "b": arm(problem="not run yet"), **far}
    assert "precondition not established" in rule.decide(unsure).reason


def test_a_facts_precondition_decides_first_and_is_named():
    """A fact with a precondition: where it fails, "inconclusive: precondition not met" with
    its name and the figures of both; where it holds, the claim decides."""
    arms = {label: Arm("softmax", "copy") for label in ("s3", "s5")}
    fact = Fact(
        source="s",
        claim="c",
        arms=arms,
        rule=Better("s3", "s5", 0.2),
        precondition=Precondition("S3 learned", AtLeast("s3", 0.9)),
    )
    assert fact.verdict_rule.declaration().startswith("given S3 learned (s3 >= 0.9")
    failed = fact.verdict_rule.decide({"s3": arm(0.3, 0.2, 0.25), "s5": arm(0.0, 0.0, 0.01)})
    assert failed.verdict == INCONCLUSIVE
    assert failed.reason.startswith("precondition not met: S3 learned (s3 >= 0.9")
    assert "s3 0.250 (0.200-0.300) over 3 seeds" in failed.figures  # the precondition's
    assert "+0.247 over 3 seeds" in failed.figures  # and the claim's
    held = fact.verdict_rule.decide({"s3": arm(0.95, 0.92, 0.97), "s5": arm(0.1, 0.05, 0.1)})
    assert held.verdict == REPRODUCED
    with pytest.raises(ValueError, match="names arms the fact lacks: s4"):
        Fact("s", "c", arms, Better("s3", "s5"), precondition=Precondition("x", AtLeast("s4", 1)))
    with pytest.raises(ValueError, match="Precondition"):
        Fact("s", "c", arms, Better("s3", "s5"), precondition=AtLeast("s3", 1))


def test_an_arms_positional_encoding_reaches_its_runs():
    plain = Arm("softmax", "induction", "smoke-block", eval_length_mult=2.0)
    rope = Arm("softmax", "induction", "smoke-block", pos="rope", eval_length_mult=2.0)
    arms = {"p": plain, "r": rope}
    fact = Fact(source="s", claim="c", arms=arms, rule=Better("r", "p"), track="block")
    specs = fact_specs(fact)
    assert specs["r"][0].protocol.pos == "rope" and specs["p"][0].protocol.pos == "learned"
    assert specs["r"][0].eval_length_mult == 2.0
    assert "pos=rope" in rope.describe() and "tested at 2x length" in rope.describe()


# -- the built-in facts ------------------------------------------------------------------------


def test_the_builtin_facts_cover_at_least_12_findings_of_6_papers():
    entries = [e for e in FACTS.entries() if e.source == "builtin"]
    assert len(entries) >= 12
    assert len({e.metadata["paper"] for e in entries}) >= 6
    for entry in entries:
        fact = entry.obj
        assert set(fact.rule.arms()) <= set(fact.arms) and set(fact.published) <= set(fact.arms)
        specs = fact_specs(fact)  # every arm plans: its names and parameters resolve
        assert all(len(s) == fact.seeds * len(fact.arms[label].tasks) for label, s in specs.items())
        protocols = {s.protocol.name for arm_specs in specs.values() for s in arm_specs}
        assert all(p.endswith("-block") == (fact.track == "block") for p in protocols), entry.name


def test_issue_70s_declarations():
    """Sanity facts marked; merrill-s5 requires attention to learn S3 at the trained length
    first; mamba-selective-copy's time-invariant arm is s4d, not retnet."""
    sanity = {e.name for e in FACTS.entries() if e.source == "builtin" and e.obj.sanity}
    assert sanity == {
        "olsson-induction-needs-two-layers",
        "sliding-window-beyond-window",
        "zoology-fixed-state-falls",
        "hedgehog-linear-maps-fail-recall",
    }
    merrill = FACTS.get("merrill-s5-harder-than-s3")
    assert merrill.precondition.name == "S3 learned"
    assert merrill.precondition.rule == AtLeast("softmax S3", S3_LEARNED)
    s3 = merrill.arms["softmax S3"]
    assert s3.mech == "softmax" and s3.task_params == {"group": "S3", "n": 4}
    assert not s3.eval_length_mult  # learned at the trained length
    copy = FACTS.get("mamba-selective-copy")
    assert {a.mech for a in copy.arms.values()} == {"mamba2", "s4d"}
    assert copy.rule == Better("mamba2", "s4d", 0.2)


def test_sanity_facts_are_counted_apart_from_the_findings():
    names = FACTS.names()
    outcomes = [decide(name, FACTS.get(name), pd.DataFrame()) for name in names]
    findings = len(names) - 4
    expected = f"{findings} findings ({findings} not run); 4 sanity facts (4 not run)"
    assert counts_line(outcomes) == f"{len(names)} facts: {expected}"
    page = to_markdown(outcomes, "nothing")
    assert re.search(r"\| olsson-induction-needs-two-layers +\| sanity +\|", page)
    assert "- **Sanity fact:** it can fail only through a bug" in page
    assert "- **Precondition:** S3 learned" in page


def test_a_malformed_fact_is_refused_in_one_line():
    arms = {"a": Arm("softmax", "copy")}
    with pytest.raises(ValueError, match="names arms the fact lacks: b"):
        Fact("src", "claim", arms, Better("a", "b"))
    with pytest.raises(ValueError, match="trains in the core track, the fact is block"):
        Fact("src", "claim", arms, AtLeast("a", 0.5), track="block")
    with pytest.raises(ValueError, match="track is one of core, block"):
        Fact("src", "claim", arms, AtLeast("a", 0.5), track="blocks")


def test_other_seeds_are_other_runs():
    fact = FACTS.get("deltanet-mqar-without-conv")
    first = fact_specs(fact)["deltanet"]
    later = fact_specs(fact, first_seed=3)["deltanet"]
    assert [s.seed for s in first] == [0, 1, 2] and [s.seed for s in later] == [3, 4, 5]
    assert not {s.run_id for s in first} & {s.run_id for s in later}


def test_mqar16_without_binding_scores_the_harmonic_level():
    """The notes of deltanet-mqar-without-conv and its neighbours read their 0.21 plateau as
    a rule that knows the context's values and which were answered, but no key's value:
    guessing among the values left scores H_16 / 16 = 0.2113 on the arms' kv_recall. Read
    off the generated stream, not the generator's code: the pairs are the tokens before the
    first answer's query, and every answer is fed back into the stream after it."""
    task = TASKS.get("kv_recall")(**MQAR16)
    batch = task.generate(500, torch.Generator().manual_seed(0))
    expected = []
    for tokens, targets in zip(batch.inputs.tolist(), batch.targets.tolist(), strict=True):
        answers = [p for p, t in enumerate(targets) if t != IGNORE]
        assert len(answers) == MQAR16["pairs"]  # queries=0: every key, once
        context = tokens[: answers[0]]  # k1 v1 ... k16 v16
        values = set(context[1::2])
        assert {targets[p] for p in answers} == values
        for j, p in enumerate(answers):
            if p + 1 < len(tokens):
                assert tokens[p + 1] == targets[p]  # the answer enters the stream
            left = values - {targets[q] for q in answers[:j]}
            expected.append(1 / len(left))
    harmonic = sum(1 / k for k in range(1, 17)) / 16
    assert sum(expected) / len(expected) == pytest.approx(harmonic, abs=1e-12)
    assert round(harmonic, 3) == 0.211
    assert "0.211" in FACTS.get("deltanet-mqar-without-conv").notes


def test_docs_list_every_builtin_fact():
    table = invoke("facts", "list", "--markdown").stdout.strip()
    assert table in (REPO / "docs" / "FACTS.md").read_text(), "regenerate: facts list --markdown"


def test_an_unknown_fact_names_the_close_matches():
    result = invoke("facts", "report", "olsson-induction", "--results", "results")
    assert_error(result, 2, "unknown fact 'olsson-induction'; did you mean")


# -- a plugin's fact, end to end --------------------------------------------------------------

PLUGIN = """
from synthbench.facts import FACTS, All, Arm, AtLeast, Better, Fact

FACTS.add(
    "copy-needs-mixing",
    Fact(
        source="a test",
        claim="softmax copies better than no mixing at all",
        arms={
            "softmax": Arm("softmax", "copy", "smoke"),
            "none": Arm("none", "copy", "smoke"),
        },
        rule=All((Better("softmax", "none", 0.0), AtLeast("softmax", 0.0))),
        seeds=2,
        published={"softmax": "1.0"},
    ),
    paper="test",
)
FACTS.add(
    "broken-fact",
    Fact(
        source="a test",
        claim="a mechanism whose runs raise",
        arms={"boom": Arm("boom", "copy", "smoke"), "none": Arm("none", "copy", "smoke")},
        rule=Better("boom", "none"),
        seeds=2,
    ),
    paper="test",
)
"""
BOOM = """
import torch
from synthbench.core.mechanism import MECHANISMS

@MECHANISMS.register("boom", family="test", complexity="quadratic", reference="-")
class Boom(torch.nn.Module):
    def __init__(self, head_dim, n_heads):
        super().__init__()

    def forward(self, q, k, v, causal=True):
        if self.training:  # the trainings raise; the causality check before them does not
            raise RuntimeError("boom")
        return v
"""


def test_a_plugin_fact_runs_and_is_judged_from_the_stored_rows(tmp_path, forget_plugins):
    plugin = tmp_path / "facts_plugin.py"
    plugin.write_text(textwrap.dedent(PLUGIN))
    results, out = tmp_path / "results", tmp_path / "reports"
    ran = invoke(
        "facts", "run", "copy-needs-mixing", "--results", results, "--jobs", "1", "--plugin", plugin
    )
    assert ran.exit_code == 0, ran.output
    assert "4 runs for 1 fact" in ran.stdout and "1 fact: " in ran.stdout
    rows = ResultStore(results).load(warn=False).rows
    assert sorted(rows["mechanism"].unique()) == ["none", "softmax"]
    # the verdict, recomputed here from the rows: the selected lr's target metric per seed
    chosen = rows[rows["selected"].astype(bool)].set_index(["mechanism", "seed"])["token_acc"]
    difference = (chosen["softmax"] - chosen["none"]).mean()
    reported = invoke("facts", "report", "copy-needs-mixing", "--results", results, "--out", out,
                      "--plugin", plugin)  # fmt: skip
    assert reported.exit_code == 0, reported.output
    page = (out / "facts.md").read_text()
    assert f"{difference:+.3f} over 2 seeds" in page
    # smoke has one lr, alone at the edge of its grid: the runs show nothing beyond it
    verdict = re.search(r"## copy-needs-mixing: (\w[\w ]*)", page).group(1)
    assert verdict == INCONCLUSIVE and "alone at an edge of its grid" in page
    assert "softmax" in (out / "facts.tex").read_text()
    # run again: nothing new trains (the runs are stored), the same verdict
    again = invoke(
        "facts", "run", "copy-needs-mixing", "--results", results, "--jobs", "1", "--plugin", plugin
    )
    assert again.exit_code == 0 and "nothing new" in again.stdout


def test_a_fact_whose_runs_raise_is_inconclusive_with_the_reason(tmp_path, forget_plugins):
    plugin, boom = tmp_path / "facts_plugin.py", tmp_path / "boom.py"
    plugin.write_text(textwrap.dedent(PLUGIN))
    boom.write_text(textwrap.dedent(BOOM))
    results = tmp_path / "results"
    ran = invoke("facts", "run", "broken-fact", "--results", results, "--jobs", "1",
                 "--plugin", boom, "--plugin", plugin)  # fmt: skip
    assert ran.exit_code == 1
    line = next(li for li in ran.stdout.splitlines() if li.startswith("broken-fact"))
    assert INCONCLUSIVE in line and "error" in line


def test_the_command_line_is_listed():
    result = invoke("facts", "--help")
    assert result.exit_code == 0 and all(c in result.stdout for c in ("list", "run", "report"))


# -- the facts runs shipped with synthbench ----------------------------------------------------


def test_shipped_rows_stand_in_for_runs_you_lack_and_yours_take_precedence(
    tmp_path, forget_plugins, monkeypatch
):
    plugin = tmp_path / "facts_plugin.py"
    plugin.write_text(textwrap.dedent(PLUGIN))
    measured = tmp_path / "measured"
    args = ["copy-needs-mixing", "--jobs", "1", "--plugin", plugin]
    assert invoke("facts", "run", *args, "--results", measured).exit_code == 0
    rows = ResultStore(measured).load(warn=False).rows
    shipped_file = tmp_path / "facts_runs.parquet"
    reference.write(rows, shipped_file)
    monkeypatch.setattr(facts_shipped, "shipped_path", lambda: shipped_file)
    fresh = tmp_path / "fresh"  # a new results folder: nothing of the user's
    ran = invoke("facts", "run", *args, "--results", fresh)
    assert ran.exit_code == 0, ran.output
    assert "4 of them measured in the shipped facts runs" in ran.stdout
    assert not ResultStore(fresh).load(warn=False).rows.size  # nothing trained
    out = tmp_path / "reports"
    shown = invoke("facts", "report", "copy-needs-mixing", "--results", tmp_path / "absent",
                   "--out", out, "--plugin", plugin)  # fmt: skip
    assert shown.exit_code == 0, shown.output
    chosen = rows[rows["selected"].astype(bool)].set_index(["mechanism", "seed"])["token_acc"]
    difference = (chosen["softmax"] - chosen["none"]).mean()
    page = (out / "facts.md").read_text()
    assert f"{difference:+.3f} over 2 seeds" in page and "shipped with synthbench" in page
    assert "predate" not in shown.output  # the file holds every arm of this fact
    # a fact whose arm changed since the file was measured (none -> linear): said in one
    # line, judged without it (inconclusive), never a failure
    changed = tmp_path / "changed_plugin.py"
    changed.write_text(textwrap.dedent(CHANGED))
    shown = invoke("facts", "report", "copy-changed", "--results", tmp_path / "absent",
                   "--out", out, "--plugin", changed)  # fmt: skip
    assert shown.exit_code == 0, shown.output
    warned = [li for li in shown.output.splitlines() if "predate" in li]
    assert len(warned) == 1 and "1 arm of 1 fact (copy-changed: linear)" in warned[0]
    assert "## copy-changed: inconclusive" in (out / "facts.md").read_text()
    # --no-shipped: judged on the user's rows alone, here none
    alone = invoke("facts", "run", *args, "--results", fresh, "--no-shipped", "--jobs", "1")
    assert alone.exit_code == 0 and "4 runs for 1 fact" in alone.stdout
    assert len(ResultStore(fresh).load(warn=False).rows) == len(rows)


CHANGED = """
from synthbench.facts import FACTS, Arm, Better, Fact

FACTS.add(
    "copy-changed",
    Fact(
        source="a test",
        claim="copy-needs-mixing with its second arm changed since the runs were shipped",
        arms={"softmax": Arm("softmax", "copy", "smoke"), "linear": Arm("linear", "copy", "smoke")},
        rule=Better("softmax", "linear", 0.0),
        seeds=2,
    ),
    paper="test",
)
"""


def test_arms_the_shipped_runs_lack_are_named_per_fact():
    fact = FACTS.get("mamba-selective-copy")
    specs = fact_specs(fact)
    mamba = pd.DataFrame({"run_id": [s.run_id for s in specs["mamba2"]]})
    nothing = pd.DataFrame({"run_id": []})
    assert facts_shipped.arms_not_shipped(fact, mamba, mamba) == ["s4d"]
    yours = pd.concat([mamba, pd.DataFrame({"run_id": [specs["s4d"][0].run_id]})])
    assert facts_shipped.arms_not_shipped(fact, mamba, yours) == []  # you have s4d's runs
    assert facts_shipped.arms_not_shipped(fact, nothing, nothing) == []  # none shipped
    assert facts_shipped.arms_not_shipped(fact, pd.DataFrame(), mamba) == []


def test_a_users_row_of_the_same_run_and_lr_wins():
    ours = pd.DataFrame({"run_id": ["a", "a"], "lr": [1e-3, 3e-3], "token_acc": [0.5, 0.6]})
    theirs = pd.DataFrame(
        {"run_id": ["a", "a", "b"], "lr": [1e-3, 1e-2, 1e-3], "token_acc": [0.9, 0.7, 0.8]}
    )
    merged = facts_shipped.with_shipped(ours, theirs)
    got = sorted(zip(merged["run_id"], merged["lr"], merged["token_acc"], strict=True))
    assert got == [("a", 1e-3, 0.5), ("a", 3e-3, 0.6), ("a", 1e-2, 0.7), ("b", 1e-3, 0.8)]


def test_a_run_is_measured_once_its_sweep_is_settled():
    rows = pd.DataFrame(
        {
            "run_id": ["done", "done", "diverged", "raised", "open"],
            "selected": [False, True, False, False, False],
            "status": ["ok", "ok", "diverged", "error", "ok"],
        }
    )
    assert facts_shipped.complete_runs(rows) == {"done", "diverged"}
