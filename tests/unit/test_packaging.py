"""What pip installs is every package of the tree: a subpackage missing from pyproject.toml installs
without error and fails at import, in the image (the operator image's pod crashed on
``ddpjob_operator.policies`` so) and for anyone who pip-installs the project."""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_every_package_directory_is_listed_in_pyproject() -> None:
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = set()
    for top, directory in setuptools["package-dir"].items():
        for init in (REPO / directory).rglob("__init__.py"):
            relative = init.parent.relative_to(REPO / directory)
            found.add(".".join([top, *relative.parts]))
    assert sorted(found - set(setuptools["packages"])) == []
