"""benchmarks/ as a shelf: docs/BENCHMARKS.md lists every script there with its command, and
no doc names a script that has left the tree but through ``git show HASH:benchmarks/NAME``."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHELF = "## The scripts in `benchmarks/`"


def shelf_rows() -> dict[str, str]:
    """Script name -> its row of docs/BENCHMARKS.md's table of scripts."""
    text = (ROOT / "docs" / "BENCHMARKS.md").read_text()
    assert SHELF in text
    section = text.split(SHELF, 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        found = re.match(r"\| `([\w.-]+\.(?:py|sh))` \|", line)
        if found:
            rows[found.group(1)] = line
    return rows


def test_every_script_is_listed_with_a_command_and_what_it_regenerates():
    scripts = sorted(p.name for p in (ROOT / "benchmarks").iterdir() if p.suffix in (".py", ".sh"))
    rows = shelf_rows()
    assert sorted(rows) == scripts
    for name, row in rows.items():
        command, regenerates = (cell.strip() for cell in row.strip("|").split("|")[1:3])
        assert command and regenerates, name


def test_docs_name_only_scripts_in_the_tree_or_in_git_history():
    docs = [
        *sorted((ROOT / "docs").glob("*.md")),
        ROOT / "README.md",
        ROOT / "benchmarks" / "runs" / "README.md",
    ]
    missing = []
    for doc in docs:
        for found in re.finditer(
            r"(\b[0-9a-f]{7,40}:)?benchmarks/([\w-]+\.(?:py|sh))", doc.read_text()
        ):
            if not found.group(1) and not (ROOT / "benchmarks" / found.group(2)).is_file():
                missing.append(f"{doc.relative_to(ROOT)}: benchmarks/{found.group(2)}")
    assert not missing
