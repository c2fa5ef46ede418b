"""A table (``Grid``: synthbench/report/tables.py) as Markdown or LaTeX.

Every name in a table comes from the results tree, so every cell is escaped for its format.
"""

from __future__ import annotations

from tabulate import tabulate

from synthbench.report.tables import MISSING, Cell, Grid


def _text(value: Cell, grid: Grid, pm: str) -> str:
    if value is None:
        return MISSING
    if isinstance(value, str):
        return value
    text = f"{value.mean:.{grid.digits}f} {pm} {value.std:.{grid.digits}f}"
    return text if value.n >= grid.n_seeds else f"{text} (n={value.n})"


# Characters that Markdown reads as markup anywhere in a line (emphasis, code, strike-through,
# a table's cell border), escaped with a backslash; < > & are HTML's, written as entities so
# that no tag or entity of the text survives. A ] is escaped where it would close a link or
# image ("](", "][", "]:"), so a bracketed interval stays as it is; an _ between two letters
# or digits too: it never emphasises there (CommonMark), and names are full of it.
_MARKDOWN_PUNCTUATION = frozenset("\\`*|~")
_HTML_ENTITIES = {"<": "&lt;", ">": "&gt;", "&": "&amp;"}


def _escaped(text: str, i: int) -> str:
    ch, after = text[i], text[i + 1 : i + 2]
    if ch in _HTML_ENTITIES:
        return _HTML_ENTITIES[ch]
    if ch in _MARKDOWN_PUNCTUATION or (ch == "]" and after in ("(", "[", ":")):
        return "\\" + ch
    if ch == "_" and not (text[i - 1 : i].isalnum() and after.isalnum()):
        return "\\_"
    return ch


def markdown_text(text) -> str:
    """``text`` shown as it is in Markdown (a table cell, a title, a note): names and
    parameter values come from the results tree, so none of their characters may act as
    Markdown or HTML markup, and a line break would end a table's row."""
    text = " ".join(str(text).splitlines())
    return "".join(_escaped(text, i) for i in range(len(text)))


class Strong(str):
    """A cell shown in bold: its text escaped, then marked (``markdown_table``)."""


def markdown_table(body: list[list], headers: list) -> str:
    """A pipe table with every cell and header escaped (``markdown_text``)."""

    def cell(value) -> str:
        return f"**{markdown_text(value)}**" if isinstance(value, Strong) else markdown_text(value)

    return tabulate(
        [[cell(c) for c in row] for row in body],
        headers=[cell(h) for h in headers],
        tablefmt="pipe",
        disable_numparse=True,
    )


def to_markdown(grid: Grid) -> str:
    best = grid.best_cells()
    body = []
    for i, labels in enumerate(grid.rows):
        texts = [_text(v, grid, "±") for v in grid.cells[i]]
        body.append([*labels, *(Strong(t) if (i, j) in best else t for j, t in enumerate(texts))])
    table = markdown_table(body, [*grid.row_headers, *grid.columns])
    notes = "".join(f"\n{markdown_text(note)}" for note in grid.shown_notes())
    return f"**{markdown_text(grid.title)}**\n\n{table}\n{notes}\n"


def latex_escape(text: str) -> str:
    replacements = {
        "\\": r"\textbackslash{}",
        "&": r"\&",
        "%": r"\%",
        "$": r"\$",
        "#": r"\#",
        "_": r"\_",
        "{": r"\{",
        "}": r"\}",
        "~": r"\textasciitilde{}",
        # names from the results tree: in the default font encoding these print as other glyphs
        "<": r"\textless{}",
        ">": r"\textgreater{}",
        "|": r"\textbar{}",
        "^": r"\textasciicircum{}",
        "±": r"$\pm$",
        "≈": r"$\approx$",
        "→": r"$\to$",
        "Δ": r"$\Delta$",
    }
    return "".join(replacements.get(ch, ch) for ch in str(text))


def to_latex(grid: Grid) -> str:
    """A booktabs tabular (needs ``\\usepackage{booktabs}``); repeated group labels in the
    first column are printed once, with a rule between groups."""
    best = grid.best_cells()
    width = len(grid.row_headers) + len(grid.columns)
    lines = [
        f"% {latex_escape(grid.title)}; needs \\usepackage{{booktabs}}",
        r"\begin{tabular}{" + "l" * len(grid.row_headers) + "c" * len(grid.columns) + "}",
        r"\toprule",
        " & ".join(latex_escape(h) for h in [*grid.row_headers, *grid.columns]) + r" \\",
        r"\midrule",
    ]
    previous = None
    for i, labels in enumerate(grid.rows):
        labels = list(labels)
        if len(labels) > 1:
            if previous is not None and labels[0] != previous:
                lines.append(r"\midrule")
            previous, labels[0] = labels[0], "" if labels[0] == previous else labels[0]
        texts = [latex_escape(_text(v, grid, "±")) for v in grid.cells[i]]
        texts = [rf"\textbf{{{t}}}" if (i, j) in best else t for j, t in enumerate(texts)]
        lines.append(" & ".join([*map(latex_escape, labels), *texts]) + r" \\")
    lines.append(r"\bottomrule")
    lines += [
        rf"\multicolumn{{{width}}}{{l}}{{\footnotesize {latex_escape(note)}}} \\"
        for note in grid.shown_notes()
    ]
    lines.append(r"\end{tabular}")
    return "\n".join(lines) + "\n"


def latex_document(fragments: list[str]) -> str:
    """A standalone document around tabulars (what the compile test and a quick look use)."""
    body = "\n\\bigskip\n\n".join(fragments)
    return (
        "\\documentclass{article}\n\\usepackage[margin=1cm,landscape]{geometry}\n"
        "\\usepackage{booktabs}\n\\begin{document}\n\\small\n"
        f"{body}\n\\end{{document}}\n"
    )
