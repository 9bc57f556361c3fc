"""The fenced blocks of a documentation page, for tests that run what a page
shows as it is written (tests/e2e/test_docs_commands.py, the nginx example,
the operations runbook), so a stale line fails a test."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Block:
    language: str
    text: str
    marker: str  # the line right before the opening fence
    line: int


def blocks(page: Path) -> list[Block]:
    found, lines, index = [], page.read_text(encoding="utf-8").splitlines(), 0
    while index < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[index])
        if not fence:
            index += 1
            continue
        end = next(i for i in range(index + 1, len(lines)) if lines[i].startswith("```"))
        marker = lines[index - 1].strip() if index else ""
        found.append(Block(fence.group(1), "\n".join(lines[index + 1 : end]), marker, index + 1))
        index = end + 1
    return found


def only_block(page: Path, language: str, containing: str = "") -> Block:
    """The one block of ``language`` on ``page`` that contains ``containing``."""
    found = [b for b in blocks(page) if b.language == language and containing in b.text]
    assert len(found) == 1, f"{page.name}: {len(found)} {language} blocks with {containing!r}"
    return found[0]


def replaced(text: str, replacements: dict[str, str], where: str) -> str:
    """``text`` with each key replaced; a key the text no longer holds fails,
    so a test that moves a documented block somewhere notices the page changed."""
    for old, new in replacements.items():
        assert old in text, f"{where} no longer holds {old!r}"
        text = text.replace(old, new)
    return text
