"""Dead-letter write paths (docs/architecture.md#dead-letters), one module per job:

- `reconcile`: the watcher's `dlq.watch` messages become dead-letter rows;
- `selection`: which open dead letters an operator's request takes, and who may ask;
- `replay`: replay and discard of the selected rows;
- `copies`: the broker's copies in each `<q>_dlq`, and acking the stale ones away;
- `locks`: the lock order every writer keeps (the jobs, then their dead letters).

Rows are created by `jobs.services.dead_letters_create` only. Callers import from the
module, not from this package.
"""
