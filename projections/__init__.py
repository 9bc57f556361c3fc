"""Read-model projections (mapped as the package ``kandev_es.projections``).

Each projection writes its rows and its tracking position in one transaction,
so every event is applied exactly once, even across crashes and rebuilds."""
