"""The folders point one way: the CLI imports the operator and the box, neither imports the other, and no module of
ours imports itself back through others (every import counted, those inside functions too)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = {
    "ddpjob_cli": REPO / "cli" / "ddpjob_cli",
    "ddpjob_contract": REPO / "contract" / "ddpjob_contract",
    "ddpjob_operator": REPO / "operator" / "ddpjob_operator",
    "ddp_trainer": REPO / "trainer" / "ddp_trainer",
    "ddpjob_box": REPO / "box" / "ddpjob_box",
}
MAY_IMPORT = {
    "ddpjob_cli": {"ddpjob_operator", "ddpjob_box", "ddpjob_contract"},
    "ddpjob_contract": set(),
    "ddpjob_operator": {"ddpjob_contract"},
    "ddp_trainer": {"ddpjob_contract"},
    "ddpjob_box": {"ddpjob_contract"},
}
"""Which of our packages each may import, besides itself."""


def modules() -> dict[str, Path]:
    found = {}
    for package, root in PACKAGES.items():
        for path in root.rglob("*.py"):
            parts = [package, *path.relative_to(root).with_suffix("").parts]
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported(path: Path) -> Iterator[str]:
    """Every module ``path`` imports, anywhere in it; ``from a import b`` names ``a`` and ``a.b``."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def graph() -> dict[str, set[str]]:
    ours = modules()
    return {name: {m for m in imported(path) if m in ours and m != name} for name, path in ours.items()}


def test_each_package_imports_only_the_packages_below_it() -> None:
    wrong = sorted(
        f"{name} imports {target}"
        for name, targets in graph().items()
        for target in targets
        if target.split(".")[0] not in {name.split(".")[0], *MAY_IMPORT[name.split(".")[0]]}
    )
    assert not wrong, wrong


def test_no_module_imports_itself_back_through_others() -> None:
    edges = graph()
    circles = []
    for start in sorted(edges):
        path, seen = [start], {start}
        stack = [iter(sorted(edges[start]))]
        while stack:
            step = next(stack[-1], None)
            if step is None:
                stack.pop()
                path.pop()
                continue
            if step == start:
                circles.append(" -> ".join([*path, start]))
            elif step not in seen:
                seen.add(step)
                path.append(step)
                stack.append(iter(sorted(edges[step])))
    assert not circles, circles
