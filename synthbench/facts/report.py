"""The facts report: a page (Markdown) with every fact's source, claim, declared rule, our
figures beside the source's and the verdict, and a booktabs table for a paper's appendix.

Every figure is regenerated from the stored rows (synthbench/facts/evaluate.py). A fact that
does not reproduce is shown with its figures like the others: the report never hides one.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from synthbench.core.atomic import write_atomically
from synthbench.core.text import plural
from synthbench.facts.evaluate import Outcome
from synthbench.facts.rules import VERDICTS
from synthbench.report.formats import latex_escape, markdown_table, markdown_text


def _verdict_counts(outcomes: list[Outcome]) -> str:
    counts = Counter(o.decision.verdict for o in outcomes)
    return ", ".join(f"{counts[v]} {v}" for v in VERDICTS if counts[v])


def counts_line(outcomes: list[Outcome]) -> str:
    """e.g. ``17 facts: 5 reproduced, 3 not reproduced, 2 inconclusive, 7 not run``; where
    some are sanity facts (they can fail only through a bug), the findings are counted
    apart: ``18 facts: 14 findings (5 reproduced, ...); 4 sanity facts (4 reproduced)``."""
    sanity = [o for o in outcomes if o.fact.sanity]
    if not sanity:
        return f"{plural(len(outcomes), 'fact')}: {_verdict_counts(outcomes)}"
    findings = [o for o in outcomes if not o.fact.sanity]
    parts = (
        [f"{plural(len(findings), 'finding')} ({_verdict_counts(findings)})"] if findings else []
    )
    parts.append(f"{plural(len(sanity), 'sanity fact')} ({_verdict_counts(sanity)})")
    return f"{plural(len(outcomes), 'fact')}: {'; '.join(parts)}"


def summary_rows(outcomes: list[Outcome]) -> list[list[str]]:
    return [
        [
            o.name,
            o.fact.kind,
            o.fact.track,
            o.decision.verdict,
            o.decision.figures or "-",
            _published(o),
        ]
        for o in outcomes
    ]


def _published(outcome: Outcome) -> str:
    return "; ".join(f"{label} {value}" for label, value in outcome.fact.published.items()) or "-"


def to_markdown(outcomes: list[Outcome], source: str) -> str:
    lines = [
        "# Facts: what the literature found, checked here",
        "",
        f"From {markdown_text(source)}; {counts_line(outcomes)}. Each rule was "
        "declared with its fact, before any run (synthbench/facts/builtin.py); a fact that "
        "does not reproduce is reported with its figures, never tuned away. Our figures: "
        "mean over seeds (min-max) of the target metric at each run's selected lr, or its "
        "chance-normalised score where the fact says so. A sanity fact can fail only through "
        "a bug (what it claims follows from the construction); it is counted apart from the "
        "findings.",
        "",
        markdown_table(
            summary_rows(outcomes), ["fact", "kind", "track", "verdict", "ours", "published"]
        ),
        "",
    ]
    for o in outcomes:
        fact = o.fact
        lines += [
            f"## {markdown_text(o.name)}: {markdown_text(o.decision.verdict)}",
            "",
            f"- **Claim:** {markdown_text(fact.claim)}",
            f"- **Source:** {markdown_text(fact.source)}",
            f"- **Rule (declared):** {markdown_text(fact.verdict_rule.declaration())}; "
            f"{fact.seeds} seeds, measure {fact.measure}, {fact.track} track",
        ]
        if fact.precondition is not None:
            condition = f"{fact.precondition.name}: {fact.precondition.rule.declaration()}"
            lines.append(f"- **Precondition:** {markdown_text(condition)}")
        if fact.sanity:
            lines.append("- **Sanity fact:** it can fail only through a bug")
        if o.decision.reason:
            lines.append(f"- **Why:** {markdown_text(o.decision.reason)}")
        if fact.notes:
            lines.append(f"- **Notes:** {markdown_text(fact.notes)}")
        body = [
            [label, arm.describe(), o.results[label].text(), fact.published.get(label, "-")]
            for label, arm in fact.arms.items()
        ]
        lines += ["", markdown_table(body, ["arm", "runs", "ours", "published"]), ""]
    return "\n".join(lines)


def to_latex(outcomes: list[Outcome]) -> str:
    """A booktabs table (needs ``\\usepackage{booktabs}``): fact, source, verdict, ours,
    published."""
    lines = [
        "% synthbench facts; needs \\usepackage{booktabs}",
        r"\begin{tabular}{lllp{6cm}p{4cm}}",
        r"\toprule",
        r"fact & source & verdict & ours & published \\",
        r"\midrule",
    ]
    for o in outcomes:
        name = f"{o.name} (sanity)" if o.fact.sanity else o.name
        cells = [name, o.fact.source, o.decision.verdict, o.decision.figures or "-"]
        cells.append(_published(o))
        lines.append(" & ".join(latex_escape(c) for c in cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


def write(outcomes: list[Outcome], out: Path, source: str) -> list[Path]:
    """reports/facts.md and reports/facts.tex, each replaced whole or not at all."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in (
        ("facts.md", to_markdown(outcomes, source)),
        ("facts.tex", to_latex(outcomes)),
    ):
        write_atomically(out / name, text)
        written.append(out / name)
    return written
