"""Agent processes: the bundled demo agent and process inspection helpers."""
