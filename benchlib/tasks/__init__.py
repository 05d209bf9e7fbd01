"""Tasks of the learning-quality suite (scripts/bench_tasks.py) that p2pnode does not ship:
each written from docs/TASKS.md alone, as a user would, and named by import string
(``benchlib.tasks.regression:task``; nodes run from the repository's root, where it imports)."""
