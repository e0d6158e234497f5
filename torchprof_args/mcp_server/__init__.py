"""``torchprof mcp``: the toolkit's commands as tools of an MCP server over stdio, for agents.

server (the SDK's low-level server, :class:`~.server.ToolRunner`: one call to its result), tools
(each command's tool: input schema, argv, output schema), schemas (the documents' JSON schemas),
roots (every path confined to the roots), bounded (a large document cut, with a pointer to the
whole), resources (the runs and cycles under the roots).  Needs the ``mcp`` extra.
"""
