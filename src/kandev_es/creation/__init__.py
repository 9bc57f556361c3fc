"""The create protocol: one implementation for every entry point."""
