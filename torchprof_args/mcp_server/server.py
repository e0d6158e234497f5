"""``torchprof mcp``: the toolkit's commands as MCP tools over stdio (the official ``mcp`` SDK).

Each tool (:mod:`.tools`) runs its command's ``document`` function, the one ``--json`` prints, on
paths confined to the roots (:mod:`.roots`); the document comes back as the result's structured
content and as its text, cut to ``--max-result-kb`` (:mod:`.bounded`) with a pointer to the whole
one (written into the cache folder, and the command line that prints it).  Errors are tool errors
of one sentence; a traceback goes to stderr only.  Tools run one at a time, in a worker thread.
The runs and cycles under the roots are the resources (:mod:`.resources`).  Nothing is written
under the roots: ``report`` writes into the cache folder, and sidecars are never written.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import io
import json
import os
import shlex
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from torchprof_args.errors import CommandError, ExitStatus, TorchProfileArgsError
from torchprof_args.mcp_server.bounded import bound
from torchprof_args.mcp_server.roots import RootError, Roots
from torchprof_args.mcp_server.tools import TOOLS, Tool

__all__ = ["Options", "ToolRunner", "serve"]

#: Bytes kept free below --max-result-kb for the ``cut`` object the server adds.
_CUT_ROOM = 2048


@dataclass(frozen=True)
class Options:
    """How the server was started (``torchprof mcp``'s flags).

    Attributes:
        roots: the folders it reads, and the largest file.
        max_result_bytes: the largest document returned whole (JSON characters).
        cache_dir: where cut documents and reports are written (a private folder outside the roots).
    """

    roots: Roots
    max_result_bytes: int
    cache_dir: str


class ToolRunner:
    """Runs one tool call to its result: the part of the server that knows no protocol (tested alone).

    Args:
        parser: the ``torchprof`` parser (console.build_parser's): a tool's argv is parsed by it.
        options: the server's options.
    """

    def __init__(self, parser: argparse.ArgumentParser, options: Options) -> None:
        self.parser = parser
        self.options = options
        self.tools = {t.name: t for t in TOOLS}

    def call(self, name: str, arguments: dict[str, Any]) -> tuple[dict[str, Any] | None, list[str]]:
        """Run tool ``name``: its (possibly cut) document and the lines of text to return beside it.

        Returns:
            (document, texts): the document is None on an error, and texts is then its one sentence.
        """
        tool = self.tools.get(name)
        if tool is None:
            return None, [f"no tool {name!r}; the tools are {', '.join(self.tools)}"]
        said = io.StringIO()
        try:
            argv = self.argv(tool, arguments)
            args = self._parse(argv)
            args.no_progress = True
            args.roots = self.options.roots.dirs  # what a command finds beside its inputs stays inside
            with contextlib.redirect_stderr(said):
                doc, status = args.document(args)
        except (CommandError, TorchProfileArgsError) as err:
            return None, [f"torchprof {name}: {_sentence(str(err))}"]
        except Exception as err:  # a bug: the traceback to the server's stderr, one line to the agent
            traceback.print_exc(file=sys.stderr)
            return None, [f"torchprof {name} failed unexpectedly ({type(err).__name__}: "
                          f"{_sentence(str(err))}); the server's stderr has the traceback"]
        return self._bounded(name, argv, doc, status, said.getvalue())

    def argv(self, tool: Tool, arguments: dict[str, Any]) -> list[str]:
        """The command line a call stands for, its arguments checked and its paths resolved."""
        from jsonschema import Draft202012Validator
        from jsonschema.exceptions import best_match

        error = best_match(Draft202012Validator(tool.input_schema()).iter_errors(arguments))
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "arguments"
            raise CommandError(f"{where}: {error.message}")
        resolved = dict(arguments)
        for key in tool.paths:
            value = arguments.get(key)
            if isinstance(value, str):
                resolved[key] = self.options.roots.resolve(value)
            elif isinstance(value, list):
                resolved[key] = [self.options.roots.resolve(v) for v in value]
        return tool.argv(resolved, self.options.cache_dir)

    def _parse(self, argv: list[str]) -> argparse.Namespace:
        said = io.StringIO()
        try:
            with contextlib.redirect_stderr(said):
                return self.parser.parse_args(argv)
        except SystemExit:
            lines = said.getvalue().strip().splitlines()
            raise CommandError(lines[-1].split("error: ", 1)[-1] if lines else "invalid arguments") from None

    def _bounded(self, name: str, argv: list[str], doc: Any, status: int, said: str
                 ) -> tuple[dict[str, Any] | None, list[str]]:
        from torchprof_args.analysis.jsonout import finite

        doc = finite(doc)
        text = json.dumps(doc)
        limit = self.options.max_result_bytes
        notes = ([f"torchprof {name} (exit status {status}) said: {said.strip()}"]
                 if said.strip() or status else [])
        if len(text) <= limit:
            return doc, [text, *notes]
        command = "torchprof " + shlex.join(argv)
        digest = hashlib.sha256(command.encode()).hexdigest()[:16]
        full = Path(self.options.cache_dir) / f"{name}-{digest}.json"
        from torchprof_args.atomic import write_text_atomically

        write_text_atomically(full, text, private=True)
        cut, cuts = bound(doc, max(limit - _CUT_ROOM, 1))
        if len(json.dumps(cut)) > limit - _CUT_ROOM:
            return None, [f"torchprof {name}: the document is {len(text) / 1024:,.0f} KiB and still over "
                          f"--max-result-kb {limit // 1024} when cut; the whole document is in {full} "
                          f"(or run: {command})"]
        cut["cut"] = {"cuts": cuts, "bytes": len(text), "full_document": str(full), "command": command}
        return cut, [json.dumps(cut), *notes]


def _sentence(text: str) -> str:
    """The first line of a message (a command's errors are one sentence; an unexpected one may not be)."""
    return text.strip().splitlines()[0] if text.strip() else "no message"


def serve(parser: argparse.ArgumentParser, options: Options) -> int:
    """Serve the tools and resources over stdin/stdout until the client closes them.

    Args:
        parser: the ``torchprof`` parser.
        options: the roots, the result bound, the cache folder.

    Returns:
        The exit status (0 when the client closed the connection).
    """
    import anyio

    anyio.run(_serve, ToolRunner(parser, options))
    return ExitStatus.OK


async def _serve(runner: ToolRunner) -> None:
    import anyio
    import mcp_types as types
    from mcp.server.lowlevel import Server
    from mcp.server.stdio import stdio_server

    from torchprof_args.mcp_server.resources import find_runs, listing, resources

    lock = anyio.Lock()
    listed = [types.Tool(name=t.name, description=t.description, input_schema=t.input_schema(),
                         output_schema=t.output(),
                         annotations=types.ToolAnnotations(read_only_hint=t.name != "report",
                                                           destructive_hint=False, idempotent_hint=True,
                                                           open_world_hint=False))
              for t in runner.tools.values()]
    roots = runner.options.roots

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=listed)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        async with lock:
            doc, texts = await anyio.to_thread.run_sync(
                functools.partial(runner.call, params.name, dict(params.arguments or {})))
        content: list[types.ContentBlock] = [types.TextContent(type="text", text=t) for t in texts]
        if doc is None:
            return types.CallToolResult(content=content, is_error=True)
        return types.CallToolResult(content=content, structured_content=doc, is_error=False)

    async def list_resources(ctx: Any, params: Any) -> types.ListResourcesResult:
        runs = await anyio.to_thread.run_sync(find_runs, roots.dirs)
        return types.ListResourcesResult(resources=[
            types.Resource(mime_type="application/json", **r) for r in resources(runs, roots.dirs)])

    async def read_resource(ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        uri = str(params.uri)
        parsed = urlparse(uri)
        real = os.path.realpath(unquote(parsed.path))
        if parsed.scheme != "file" or not roots.holds(real):
            raise RootError(f"{uri} is not a run or cycle under the folders this server reads")
        found = listing(await anyio.to_thread.run_sync(find_runs, roots.dirs), real)
        if found is None:
            raise RootError(f"{uri} is not a run or cycle folder (list the resources for those there are)")
        return types.ReadResourceResult(contents=[
            types.TextResourceContents(uri=uri, mime_type="application/json", text=json.dumps(found))])

    server: Server[Any] = Server(
        "torchprof", version=_version(),
        instructions="torchprof-args' trace toolkit over the profiled runs under this server's roots: start "
                     "with diagnose on a run or cycle folder (the resources list them), then critical-path "
                     "with what_if questions, summary, mem, collectives, hang, trend, diff, report.",
        on_list_tools=list_tools, on_call_tool=call_tool,
        on_list_resources=list_resources, on_read_resource=read_resource)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torchprof-args")
    except PackageNotFoundError:
        return "0"
