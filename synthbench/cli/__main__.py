"""``python -m synthbench.cli``: the same as the ``synthbench`` command."""

from synthbench.cli import main

main()
