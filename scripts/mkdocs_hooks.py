"""MkDocs hooks (mkdocs.yml): the API page's route list is generated from
http/openapi.json, and that document and http/examples.http are published beside
the pages, so the site can never list a route the service does not have, or miss
one it has. The header's repository link stays a plain link: Material's script
would otherwise ask the repository host's API for its stars and forks each visit
(the site loads nothing from another host)."""

from __future__ import annotations

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


def on_files(files: Files, config: Any) -> Files:
    for name in PUBLISHED:
        files.append(File.generated(config, name, abs_src_path=str(ROOT / "http" / name)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if ROUTES_MARKER in markdown:
        spec = json.loads(OPENAPI.read_text(encoding="utf-8"))
        markdown = markdown.replace(ROUTES_MARKER, route_table(spec))
    return markdown


def on_post_page(output: str, page: Any, config: Any) -> str:
    return output.replace(REPOSITORY_FACTS, "")
