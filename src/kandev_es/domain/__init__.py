"""Pure domain: aggregates and value objects. No I/O lives here."""
