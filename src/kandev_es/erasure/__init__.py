"""Erasure (docs/auditing.md: Erasure): forgetting a task's free text while
every stored event, leaf, checkpoint and proof stays byte-identical."""
