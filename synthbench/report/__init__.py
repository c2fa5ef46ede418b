"""From stored rows to what a reader sees: aggregated runs, tables (Markdown, LaTeX), the
leaderboard and its page, figures, learning curves, frontiers, separation, how informative
each task is (``informative``: ``audit --informative``), comparisons with published tables,
the shipped reference, and ``publish`` that writes reports/."""
