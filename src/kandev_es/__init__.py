"""kandev-es: idempotent task creation by external ID, event-sourced."""

__version__ = "0.1.0"
