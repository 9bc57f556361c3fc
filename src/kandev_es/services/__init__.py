"""Service layer beside the create protocol: workspaces, tokens, task queries
and edits. Entry points call these; these call the application."""
