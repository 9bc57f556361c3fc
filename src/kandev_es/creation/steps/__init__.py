"""Creation steps: one module per external effect, each idempotent by key, with
run, reconcile (decide an unknown from the world) and compensate."""
