"""The create protocol (DESIGN §4): one implementation for every entry point."""
