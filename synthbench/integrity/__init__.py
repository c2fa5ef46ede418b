"""What makes a result trustworthy: causality (no mechanism sees later positions; run's leak
guard), the rest of a mechanism's contract (``synthbench check``), and the task audit's
shortcut baselines and chance."""
