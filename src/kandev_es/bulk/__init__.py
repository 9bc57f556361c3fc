"""A batch of creates by external ID (POST /api/v1/tasks/batch): every item
through the one create protocol's pieces (creation/), effect-free items saved
together, one save per chunk."""
