"""Storage adapters: the event store wiring, read-model tables, counters."""
