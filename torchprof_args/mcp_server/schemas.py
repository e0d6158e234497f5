"""The JSON schemas of the documents ``torchprof mcp``'s tools return: each command's ``--json``.

Where a command's document is a typed struct (``JobDiagnosis``, ``CriticalPathDoc``, ...), its
schema is msgspec's, loosened for what the server may do to a document: a number may be null (NaN
and infinity are written as null, :func:`~torchprof_args.analysis.jsonout.finite`), an array may be
shorter than its declared length and a string cut (:mod:`.bounded`), and a ``cut`` object may be
added (what was cut and where the whole document is).  Where it is a plain dict (``hang``,
``trend``, ``diff``), the schema names its top-level keys only.  The client checks every result
against its tool's schema (the SDK's ``ClientSession.call_tool`` does).
"""

from __future__ import annotations

from typing import Any

__all__ = ["CUT_SCHEMA", "loosened", "struct_schema", "summary_schema"]

#: What the server adds to a document it cut (:mod:`.bounded`).
CUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "present only when the document was cut to the server's --max-result-kb: the cuts by "
                   "JSON pointer, the whole document's size, where it was written, and the command line "
                   "that prints it",
    "properties": {
        "cuts": {"type": "object", "additionalProperties": {"type": "string"}},
        "bytes": {"type": "integer"},
        "full_document": {"type": "string"},
        "command": {"type": "string"},
    },
}


def loosened(schema: Any) -> Any:
    """``schema`` with every number nullable and no array length or string length bound."""
    if isinstance(schema, list):
        return [loosened(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: loosened(v) for k, v in schema.items()
           if k not in ("minItems", "maxItems", "minLength", "maxLength", "pattern")}
    if out.get("type") == "number":
        out["type"] = ["number", "null"]
    return out


def struct_schema(document: type, description: str) -> dict[str, Any]:
    """The output schema of a tool whose document is the msgspec struct ``document``."""
    import msgspec

    (ref,), defs = msgspec.json.schema_components([document])
    name = ref["$ref"].rsplit("/", 1)[-1]
    top = dict(defs[name])
    top["properties"] = {**top["properties"], "cut": CUT_SCHEMA}
    top["description"] = description
    return loosened({**top, "$defs": defs})


def summary_schema(summary: type, view: type) -> dict[str, Any]:
    """``summary --json``'s lines as one object: each trace's summary, then each cycle's view."""
    import msgspec

    (summary_ref, view_ref), defs = msgspec.json.schema_components([summary, view])
    line = {"anyOf": [summary_ref, {"type": "object", "required": ["cross_rank", "cycle"],
                                    "properties": {"cross_rank": view_ref, "cycle": {"type": "string"}}}]}
    return loosened({
        "type": "object", "required": ["lines"],
        "description": "`torchprof summary --json`'s lines, in order: one summary per trace, then per "
                       "cycle of several traces its cross-rank view",
        "properties": {"lines": {"type": "array", "items": line}, "cut": CUT_SCHEMA},
        "$defs": defs,
    })
