"""Functions short (the charter: at most 60 lines): every function and method
in src/ and projections/, nested ones included, counted from its ``def`` line
to its last line (decorators not counted, its docstring and comments are).
A longer one usually holds two ideas: split it where they part."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 60


def long_functions(base: Path, root: Path = ROOT) -> list[str]:
    found = []
    for path in sorted(base.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_LINES:
                    where = path.relative_to(root)
                    found.append(f"{where}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_in_src_or_projections_is_over_60_lines():
    long = long_functions(ROOT / "src") + long_functions(ROOT / "projections")
    assert long == [], "split these:\n" + "\n".join(long)


def test_the_rule_sees_a_long_function(tmp_path):
    body = "\n".join(f"    x{n} = {n}" for n in range(MAX_LINES - 1))
    (tmp_path / "long.py").write_text(f"def fits():\n{body}\n\n\ndef over():\n{body}\n    y = 0\n")
    assert long_functions(tmp_path, tmp_path) == [f"long.py:{MAX_LINES + 3} over (61 lines)"]
