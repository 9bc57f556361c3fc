"""The fenced recovery Runtime (AC-8): the only actor that may resume or abort
another owner's creation, and only from its durable manifest."""
