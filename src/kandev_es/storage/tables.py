"""Read-model table names, suffixed during a blue/green rebuild
(``<table>_next``). Names are fixed identifiers checked here, never caller
input, which is why projections may put them into SQL text."""

from __future__ import annotations

import re
from typing import Any

_NAME = re.compile(r"[a-z_][a-z0-9_]*")


class TableSet:
    """Table names a projection writes, suffixed during a blue/green rebuild.
    Names are fixed identifiers checked here, never caller input."""

    tables: tuple[str, ...] = ()

    def __init__(self, suffix: str = "") -> None:
        if suffix and not _NAME.fullmatch(suffix.lstrip("_")):
            raise ValueError(f"bad table suffix {suffix!r}")
        self.suffix = suffix

    def t(self, table: str) -> str:
        if table not in self.tables:
            raise ValueError(f"{type(self).__name__} does not own table {table!r}")
        return table + self.suffix

    def with_suffix(self, suffix: str) -> Any:
        return type(self)(suffix)
