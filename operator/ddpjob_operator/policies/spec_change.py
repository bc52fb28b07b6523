"""A spec edited while the job was suspended, and resumed before the operator saw the edit: the attempt's pods were
built from the old spec, so the job starts afresh from the new one."""

from __future__ import annotations

from ddpjob_operator.transitions import Rebuild, Transition
from ddpjob_operator.view import View


def rule(v: View) -> Transition | None:
    """The spec was edited while suspended and resumed before we saw it: start afresh."""
    return Rebuild() if v.obs.outdated else None
