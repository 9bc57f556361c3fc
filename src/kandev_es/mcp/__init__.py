"""The MCP adapter (official ``mcp`` SDK): ``create_task_kandev`` and the task
tools, over stdio (``kandev-es mcp``) or streamable HTTP (``--http``). Like the
REST adapter it parses, calls the one service, and maps the result."""
