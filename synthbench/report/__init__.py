"""From stored rows to what a reader sees: aggregated runs, tables (Markdown, LaTeX), the
leaderboard and its page, figures, learning curves, frontiers, separation, comparisons with
published tables, the shipped reference, and ``publish`` that writes reports/."""
