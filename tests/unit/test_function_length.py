"""No function of the operator is over 50 lines (issue 44): a longer one is split along its seams."""

from __future__ import annotations

import ast
from pathlib import Path

OPERATOR = Path(__file__).resolve().parents[2] / "operator" / "ddpjob_operator"
MAX_LINES = 50


def lengths() -> list[tuple[str, int]]:
    """Every function and method of the operator ('path:line name'), and its length in lines, decorators left out."""
    found = []
    for path in sorted(OPERATOR.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                where = f"{path.relative_to(OPERATOR.parents[1])}:{node.lineno} {node.name}"
                found.append((where, (node.end_lineno or node.lineno) - node.lineno + 1))
    return found


def test_the_count_sees_the_operators_functions() -> None:
    names = {where.split()[-1] for where, _ in lengths()}
    assert {"apply", "pod_view", "pod", "read", "_execute"} <= names


def test_no_operator_function_is_over_50_lines() -> None:
    long = [f"{where}: {n} lines" for where, n in lengths() if n > MAX_LINES]
    assert not long, f"over {MAX_LINES} lines, to be split along their seams: " + "; ".join(long)


def test_the_plan_keeps_to_250_lines_its_rules_living_in_policies() -> None:
    lines = len((OPERATOR / "lifecycle.py").read_text().splitlines())
    assert lines <= 250, f"lifecycle.py is {lines} lines: move a rule or a plan adjustment into policies/"
