"""The operator's namespace patterns read as Kopf reads them: one rule for Kopf's scan and the pod cache."""

from __future__ import annotations

import pytest
from kopf._cogs.structs.references import NamespaceName, match_namespace  # the rule itself, to check ours against

from ddpjob_operator import namespaces

NAMES = ("team-a", "team-b", "kube-system", "ml-pr-1", "ml-pr-2", "[x]")
PATTERNS = ("team-a", "team-*", "!kube-system", "*, !team-b", "ml-*, !*-pr-*, *pr-1", "!*-pr-*, *pr-1", "team-?")


@pytest.mark.parametrize("pattern", PATTERNS)
def test_a_namespace_matches_a_pattern_exactly_when_kopf_says_so(pattern: str) -> None:
    kopfs = [n for n in NAMES if match_namespace(NamespaceName(n), pattern)]
    assert [n for n in NAMES if namespaces.matches(n, pattern)] == kopfs


@pytest.mark.parametrize(
    ("namespace", "pattern"),
    [("team-a", False), ("team-*", True), ("team-?", True), ("team-[ab]", True), ("!kube-system", True),
     ("a, b", True)],
)  # fmt: skip
def test_globs_exclusions_and_comma_lists_are_patterns_and_a_plain_name_is_not(namespace: str, pattern: bool) -> None:
    assert namespaces.is_pattern(namespace) is pattern


def test_no_patterns_serve_every_namespace_and_several_serve_what_any_of_them_matches() -> None:
    assert namespaces.served("anything", [])
    assert namespaces.served("team-b", ["team-a", "team-*"]) and not namespaces.served("ml", ["team-a", "!ml"])
