"""The Layout of docs/architecture.md names every package and module of the
installed package (src/kandev_es and the top-level projections/), so a new module
fails here until the documentation says what it is for."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def layout_block() -> str:
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = page.split("\n## Layout\n", 1)[1]
    return section.split("```", 2)[1]


def unnamed(layout: str) -> list[str]:
    missing = []
    for base in (ROOT / "src" / "kandev_es", ROOT / "projections"):
        for path in sorted(base.rglob("*.py")):
            relative = path.relative_to(ROOT)
            if path.name == "__init__.py":
                name = path.parent.name + "/"
                if path.parent != base and name not in layout:
                    missing.append(f"{relative.parent}/ (package)")
            elif not re.search(rf"\b{re.escape(path.stem)}\b", layout):
                missing.append(str(relative))
    return missing


def test_layout_names_every_package_and_module() -> None:
    missing = unnamed(layout_block())
    assert missing == [], "docs/architecture.md Layout does not name: " + ", ".join(missing)


def test_a_module_the_layout_omits_is_reported() -> None:
    layout = layout_block().replace("placement", "")
    assert unnamed(layout) == ["src/kandev_es/creation/placement.py"]


def test_the_import_order_drawn_is_the_one_the_layer_test_enforces() -> None:
    from tests.unit.test_layers import LAYERS

    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = page.split("\n## Layout\n", 1)[1]
    drawing = next(block for block in section.split("```")[1::2] if "→" in block)
    drawn = [
        [sorted(name.strip() for name in group.split(",")) for group in layer.split("|")]
        for layer in " ".join(drawing.split()).split("→")
    ]
    enforced = [
        [sorted(prefix for prefix in group if prefix) for group in layer] for layer in LAYERS
    ]
    assert drawn == enforced
