"""Which namespaces the operator serves, read the way Kopf reads ``--namespace``.

Kopf takes a list of patterns; a namespace is served when any of them matches. A pattern is a
comma-separated list of globs; a glob starting with ``!`` excludes, and a pattern whose first
glob excludes starts from ``*`` (so ``!kube-system`` is every namespace but that one). A plain
name is no pattern: Kopf then needs no namespace scan, and our pod cache watches that namespace
alone instead of the whole cluster.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence

PATTERN_CHARACTERS = frozenset("*?[!,")


def is_pattern(namespace: str) -> bool:
    """Whether ``namespace`` is a pattern (globs, ``!`` exclusions, a comma list) rather than one name."""
    return any(c in PATTERN_CHARACTERS for c in namespace)


def any_pattern(namespaces: Sequence[str]) -> bool:
    return any(is_pattern(ns) for ns in namespaces)


def matches(namespace: str, pattern: str) -> bool:
    """Kopf's rule: the first glob includes, later ones exclude (``!``) or include again what was excluded."""
    globs = [glob.strip() for glob in pattern.split(",")]
    if globs[0].startswith("!"):
        globs.insert(0, "*")
    first = found = fnmatch.fnmatchcase(namespace, globs[0])
    for glob in globs[1:]:
        if glob.startswith("!"):
            found = found and not fnmatch.fnmatchcase(namespace, glob.lstrip("!"))
        else:
            found = found or (first and fnmatch.fnmatchcase(namespace, glob))
    return found


def served(namespace: str, patterns: Sequence[str]) -> bool:
    """Whether the operator serves ``namespace`` (no patterns: all namespaces)."""
    return not patterns or any(matches(namespace, p) for p in patterns)
