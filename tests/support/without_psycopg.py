"""Run ``kandev-es`` (or a snippet) as a plain ``pip install`` would: with
psycopg and psycopg_pool impossible to import, as when the ``postgres`` extra
is not installed. Usage: ``python without_psycopg.py serve --port N`` or
``python without_psycopg.py -c CODE``."""

from __future__ import annotations

import importlib.abc
import sys
from typing import Any

BLOCKED = ("psycopg", "psycopg_pool", "psycopg_binary", "psycopg_c")


class BlockPsycopg(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        if fullname.split(".")[0] in BLOCKED:
            raise ImportError(f"No module named {fullname!r} (blocked: no postgres extra)")
        return None


def install() -> None:
    for name in list(sys.modules):
        if name.split(".")[0] in BLOCKED:
            del sys.modules[name]
    sys.meta_path.insert(0, BlockPsycopg())


if __name__ == "__main__":
    install()
    if sys.argv[1:2] == ["-c"]:
        code = sys.argv[2]
        sys.argv = ["-c", *sys.argv[3:]]
        exec(compile(code, "<without_psycopg>", "exec"), {"__name__": "__main__"})
    else:
        from kandev_es.cli import main

        sys.argv = ["kandev-es", *sys.argv[1:]]
        main()
