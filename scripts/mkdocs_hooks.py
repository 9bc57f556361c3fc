"""MkDocs hooks (mkdocs.yml): the API page's route list is generated from
http/openapi.json, and that document and http/examples.http are published beside
the pages, so the site can never list a route the service does not have, or miss
one it has. The API reference (docs/api-reference.md's ``[OAD(...)]``) is rendered
here with essentials-openapi, the library of the neoteroi plugin, from the same
document reordered and given examples (``reference_document``). The header's
repository link stays a plain link: Material's script would otherwise ask the
repository host's API for its stars and forks each visit (the site loads nothing
from another host)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
OPENAPI = ROOT / "http" / "openapi.json"
PUBLISHED = ("openapi.json", "examples.http")
ROUTES_MARKER = "<!-- routes from openapi.json -->"
REPOSITORY_FACTS = ' data-md-component="source"'
METHODS = ("get", "post", "put", "patch", "delete")


def route_table(spec: dict[str, Any]) -> str:
    """One row per operation of the OpenAPI document: method, path, summary, statuses."""
    rows = ["| method | path | what | answers |", "|---|---|---|---|"]
    for path, item in spec["paths"].items():
        for method in METHODS:
            if method not in item:
                continue
            operation = item[method]
            summary = (operation.get("summary") or operation.get("description") or "").strip()
            summary = summary.splitlines()[0].replace("|", "\\|") if summary else ""
            statuses = ", ".join(code for code in operation.get("responses", {}) if code.isdigit())
            rows.append(f"| {method.upper()} | `{path}` | {summary} | {statuses} |")
    return "\n".join(rows)


OAD_TAG = "[OAD(./http/openapi.json)]"
# The values a string of these formats shows when its schema gives no example:
# the ids and times of the tours (docs/getting-started.md).
FORMAT_EXAMPLES = {
    "uuid": "fb9321b5-b148-403c-a749-39242b4cb9f2",
    "date-time": "2026-12-02T16:27:23.142024+00:00",
}
NAMED_UUIDS = {"workspace_id": "7fc25427-7f8a-5abf-9d5e-8f212c56c7f1"}
UNSHOWN = "…"  # a string whose schema has no example: elided, not made up


def example_of(schema: dict[str, Any], spec: dict[str, Any], name: str = "",
               *, whole: bool = True, depth: int = 0) -> Any:
    """An example value built from the schema's own ``example``s (then its
    default, its first enum value, null where it may be null). ``whole=False``
    (a request body) keeps only the required properties and those with an
    example of their own: what a caller sends."""
    if "$ref" in schema:
        target: Any = spec
        for part in schema["$ref"].lstrip("#/").split("/"):
            target = target[part]
        return example_of(target, spec, name, whole=whole, depth=depth)
    for key in ("example", "default"):
        if key in schema:
            return schema[key]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("allOf", "oneOf", "anyOf"):
        if schema.get(key):
            return example_of(schema[key][0], spec, name, whole=whole, depth=depth)
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        required = set(schema.get("required", []))
        return {
            key: example_of(value, spec, key, depth=depth + 1)
            for key, value in schema.get("properties", {}).items()
            if depth < 6 and (whole or key in required or "example" in value)
        }
    if kind == "array":
        return [example_of(schema.get("items", {}), spec, name, depth=depth + 1)]
    if schema.get("nullable"):
        return None
    if kind == "string":
        if schema.get("format") == "uuid":
            return NAMED_UUIDS.get(name, FORMAT_EXAMPLES["uuid"])
        return FORMAT_EXAMPLES.get(schema.get("format", ""), UNSHOWN)
    return {"boolean": False, "integer": schema.get("minimum", 1)}.get(kind, schema.get("minimum"))


def reference_document(spec: dict[str, Any]) -> dict[str, Any]:
    """What the API reference renders: the operations in the order of the
    document's tags (tasks first, the agent-side routes later; the file itself
    lists paths alphabetically), the create first among the tasks, and every
    body without an example given one from its schema's own examples, instead
    of the renderer's own (random values, flagged "not accurate")."""
    doc = copy.deepcopy(spec)
    ranks = {tag["name"]: rank for rank, tag in enumerate(doc.get("tags", []))}

    def rank(entry: tuple[str, dict[str, Any]]) -> tuple[int, int, str]:
        path, item = entry
        tags = [tag for method in METHODS for tag in item.get(method, {}).get("tags", [])]
        return (ranks.get(tags[0], len(ranks)) if tags else len(ranks),
                0 if path == "/api/v1/tasks" else 1, path)

    doc["paths"] = dict(sorted(doc["paths"].items(), key=rank))
    bodies = [(answer, True) for answer in doc.get("components", {}).get("responses", {}).values()]
    for item in doc["paths"].values():
        for operation in (item[method] for method in METHODS if method in item):
            bodies.append((operation.get("requestBody", {}), False))
            bodies += [(answer, True) for answer in operation.get("responses", {}).values()]
    for body, whole in bodies:
        for media in body.get("content", {}).values():
            if "schema" in media and not {"example", "examples"} & media.keys():
                # (the renderer makes its own of a falsy one: {} when nothing is required)
                example = example_of(media["schema"], doc, whole=whole)
                media["example"] = example or example_of(media["schema"], doc)
    return doc


def api_reference(spec: dict[str, Any]) -> str:
    from openapidocs.mk.v3 import OpenAPIV3DocumentationHandler

    handler = OpenAPIV3DocumentationHandler(
        reference_document(spec), style="MKDOCS", source=str(OPENAPI)
    )
    text: str = handler.write()
    return text


def on_files(files: Files, config: Any) -> Files:
    for name in PUBLISHED:
        files.append(File.generated(config, name, abs_src_path=str(ROOT / "http" / name)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if ROUTES_MARKER in markdown:
        spec = json.loads(OPENAPI.read_text(encoding="utf-8"))
        markdown = markdown.replace(ROUTES_MARKER, route_table(spec))
    if OAD_TAG in markdown:
        spec = json.loads(OPENAPI.read_text(encoding="utf-8"))
        markdown = markdown.replace(OAD_TAG, api_reference(spec))
    return markdown


def on_post_page(output: str, page: Any, config: Any) -> str:
    return output.replace(REPOSITORY_FACTS, "")
