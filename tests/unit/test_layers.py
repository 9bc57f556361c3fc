"""Layers point one way (docs/architecture.md: Layout). Every module of the package sits in
one group of one layer; a module may import its own group and any group of a
lower layer, never a higher layer and never another group of its own layer.
Every import counts: module level, inside a function, under TYPE_CHECKING.

A new module outside every group fails here until it is placed in LAYERS."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "kandev_es"

# Lowest first. Each layer is a tuple of groups; a group is a set of module
# prefixes (a package, or single modules) relative to kandev_es ("" = the
# package's own __init__, its version).
LAYERS: tuple[tuple[tuple[str, ...], ...], ...] = (
    (("", "errors", "redaction"),),
    (("config",), ("limits",), ("access_log",), ("loops",)),
    (("domain",), ("metrics",), ("observability",)),
    (("views",),),
    (("storage",), ("agent",)),
    (("application",),),
    (("projections",),),
    (("creation",),),
    (("services",), ("runtime",), ("bulk",), ("erasure",)),
    (("webhooks",),),
    (("bootstrap",),),
    # A node's background work over the services; api/ starts it in threads
    # (KANDEV_BACKGROUND=threads), the CLI runs it as a process, serve supervises it.
    (("background",),),
    # MCP answers with the REST error contract through errors.http_status, not
    # through api/ (which would build the whole Flask app): the two never import
    # each other.
    (("api",), ("agentctl",), ("client",), ("mcp",)),
    (("cli", "cli_ops", "cli_parked", "cli_agentctl", "cli_ledger", "cli_tasks", "cli_numbers",
      "cli_usage", "cli_webhooks", "cli_import", "server", "http_worker", "http_limits",
      "mcp_http"),),
)


@dataclass(frozen=True)
class Group:
    layer: int
    prefixes: tuple[str, ...]

    @property
    def name(self) -> str:
        return "+".join(p or PACKAGE for p in self.prefixes)


GROUPS = [Group(n, prefixes) for n, layer in enumerate(LAYERS) for prefixes in layer]


def group_of(module: str) -> Group | None:
    """The group of ``kandev_es.<...>`` by its longest matching prefix."""
    relative = module.removeprefix(PACKAGE).removeprefix(".")
    best: tuple[int, Group] | None = None
    for group in GROUPS:
        for prefix in group.prefixes:
            if prefix == "":
                matched = relative == ""
            else:
                matched = relative == prefix or relative.startswith(prefix + ".")
            if matched and (best is None or len(prefix) > best[0]):
                best = (len(prefix), group)
    return best[1] if best else None


def modules() -> dict[str, Path]:
    """Every module of the installed package: src/kandev_es and the top-level
    projections/ (installed as kandev_es.projections)."""
    found: dict[str, Path] = {}
    for base, prefix in (
        (ROOT / "src" / PACKAGE, (PACKAGE,)),
        (ROOT / "projections", (PACKAGE, "projections")),
    ):
        for path in sorted(base.rglob("*.py")):
            parts = [*prefix, *path.relative_to(base).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports_of(module: str, source: str, is_package: bool, known: set[str]) -> set[str]:
    """The kandev_es modules ``source`` imports (relative imports resolved)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == PACKAGE)
        elif isinstance(node, ast.ImportFrom):
            target = node.module or ""
            if node.level:
                base = module.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, target] if target else base)
            if target.split(".")[0] != PACKAGE:
                continue
            for alias in node.names:  # ``from kandev_es.api import errors`` names a module
                found.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in known else target)
    return found


def violations(module: str, imported: set[str]) -> list[str]:
    own = group_of(module)
    assert own is not None, (
        f"{module} is in no layer: place it in LAYERS (tests/unit/test_layers.py)"
    )
    found = []
    for target in sorted(imported):
        other = group_of(target)
        assert other is not None, f"{target} (imported by {module}) is in no layer"
        if other == own or other.layer < own.layer:
            continue
        relation = "a higher layer" if other.layer > own.layer else "another group of its layer"
        found.append(f"{module} ({own.name}) imports {target} ({other.name}): {relation}")
    return found


def test_every_import_points_down():
    known = modules()
    found = []
    for module, path in known.items():
        imported = imports_of(
            module, path.read_text(encoding="utf-8"), path.name == "__init__.py", set(known)
        )
        found.extend(violations(module, imported))
    assert found == [], "\n".join(found)


def test_an_upward_import_is_caught():
    """The rule itself: a domain module importing the service layer, or the
    runtime importing the composition root, is reported."""
    known = set(modules())
    source = "from kandev_es.services.auth import TokenService\nfrom . import identity\n"
    imported = imports_of("kandev_es.domain.token", source, False, known)
    assert imported == {"kandev_es.services.auth", "kandev_es.domain.identity"}
    assert violations("kandev_es.domain.token", imported) == [
        "kandev_es.domain.token (domain) imports kandev_es.services.auth (services): a higher layer"
    ]
    lazy = "def f():\n    from kandev_es.bootstrap import Services\n"
    assert violations(
        "kandev_es.runtime.recovery", imports_of("kandev_es.runtime.recovery", lazy, False, known)
    )
    flask_app = "from kandev_es.api.errors import register\n"
    assert violations(
        "kandev_es.mcp.errors", imports_of("kandev_es.mcp.errors", flask_app, False, known)
    ) == [
        "kandev_es.mcp.errors (mcp) imports kandev_es.api.errors (api): another group of its layer"
    ]
    sideways = "from kandev_es.runtime.recovery import Runtime\n"
    assert violations(
        "kandev_es.services.tasks", imports_of("kandev_es.services.tasks", sideways, False, known)
    ) == [
        "kandev_es.services.tasks (services) imports kandev_es.runtime.recovery (runtime):"
        " another group of its layer"
    ]


def test_the_mcp_adapter_loads_without_the_flask_app():
    """MCP's error statuses come from errors.py: importing the MCP server builds
    no part of the REST app (kandev_es.api, Flask, flask-smorest)."""
    import subprocess
    import sys

    probe = (
        "import sys, kandev_es.mcp.server\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('flask', 'flask_smorest')"
        " or m.startswith('kandev_es.api')))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.strip()
    assert loaded == "[]"
