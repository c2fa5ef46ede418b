"""What every other room builds on: the registry, the task and mechanism interfaces, the shared
linear-attention core, the model and its positions, parameter checking, and small helpers
(atomic writes, plural nouns). Nothing here imports from run/, integrity/ or report/."""
