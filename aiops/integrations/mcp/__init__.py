"""MCP both ways: external MCP servers as gated tools (the `mcp` plugin), and aiops as an MCP
server at /mcp (the `mcp_server` plugin). See docs/MCP.md."""
