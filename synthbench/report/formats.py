"""A table (``Grid``: synthbench/report/tables.py) as Markdown or LaTeX.

Every name in a table comes from the results tree, so every cell is escaped for its format.
"""

from __future__ import annotations

from tabulate import tabulate

from synthbench.report.tables import MISSING, Cell, Grid


def _text(value: Cell, grid: Grid, pm: str) -> str:
    """A cell as printed: ``mean ± std``, the mean alone for one seed (a spread of one value
    says nothing), ``(n=k)`` after a cell with fewer seeds than the table's."""
    if value is None:
        return MISSING
    if isinstance(value, str):
        return value
    text = f"{value.mean:.{grid.digits}f}"
    if value.n > 1:
        text += f" {pm} {value.std:.{grid.digits}f}"
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
        "√": r"$\surd$",
        "·": r"$\cdot$",
    }
    return "".join(replacements.get(ch, ch) for ch in str(text))


def to_latex(grid: Grid, notes_below: bool = False) -> str:
    """A booktabs tabular (needs ``\\usepackage{booktabs}``); repeated group labels in the
    first column are printed once, with a rule between groups. The notes are its last rows,
    or, with ``notes_below``, a paragraph below it (``latex_notes``: long notes wrap there).
    """
    best = grid.best_cells()
    width = len(grid.row_headers) + len(grid.columns)
    lines = [
        f"% {latex_escape(grid.title)}; needs \\usepackage{{{_packages(grid)}}}",
        r"\begin{tabular}{"
        + "l" * len(grid.row_headers)
        + (grid.latex_columns or "c" * len(grid.columns))
        + "}",
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
    if not notes_below:
        lines += [
            rf"\multicolumn{{{width}}}{{l}}{{\footnotesize {latex_escape(note)}}} \\"
            for note in grid.shown_notes()
        ]
    lines.append(r"\end{tabular}")
    text = "\n".join(lines) + "\n"
    return text + latex_notes(grid.shown_notes()) if notes_below else text


def _packages(grid: Grid) -> str:
    """What a grid's tabular needs: booktabs, and array where a column type says ``>{...}``
    (a wrapped column set ragged right)."""
    return "booktabs,array" if ">" in (grid.latex_columns or "") else "booktabs"


RAGGED = r">{\raggedright\arraybackslash}"  # a p{} column's text set ragged, not justified


def latex_notes(notes: list[str]) -> str:
    """Notes below a tabular, as a paragraph in small type: they wrap at the width of the
    text around them, where notes in a table cell would widen the table to their length."""
    body = "\n".join(f"{latex_escape(note)}\\par" for note in notes)
    return f"{{\\footnotesize\\par\\smallskip\n{body}\n\\par}}\n"


def latex_document(fragments: list[str]) -> str:
    """A standalone document around tabulars (what the compile test and a quick look use)."""
    body = "\n\\bigskip\n\n".join(fragments)
    return (
        "\\documentclass{article}\n\\usepackage[margin=1cm,landscape]{geometry}\n"
        "\\usepackage{booktabs,array}\n\\begin{document}\n\\small\n"
        f"{body}\n\\end{{document}}\n"
    )
