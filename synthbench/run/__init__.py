"""From a selection to stored rows: a run's spec and protocol, grids and sweep files, the
learning-rate selection, one training (train.py), the runner and its executors (in-process,
local workers, Ray), claims between commands, and the results store and its schema."""
