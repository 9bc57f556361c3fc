"""setup.cfg lists its packages by name (package_dir maps projections/ and the
client in), so a package folder it forgets is left out of every wheel and
non-editable install while editable installs and the tests still find it."""

from __future__ import annotations

import configparser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def listed_packages() -> set[str]:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    return {line.strip() for line in config["options"]["packages"].splitlines() if line.strip()}


def package_folders() -> set[str]:
    source = ROOT / "src"
    return {
        ".".join(init.parent.relative_to(source).parts)
        for init in source.rglob("__init__.py")
        if "__pycache__" not in init.parts
    }


def test_setup_cfg_lists_every_package_of_the_source_tree():
    missing = sorted(package_folders() - listed_packages())
    assert missing == [], f"add to [options] packages in setup.cfg: {', '.join(missing)}"
