"""A node the job no longer excludes (``status.excludedNodes`` cleared by the user, or expired) that a rank not yet
placed was built to avoid: the gang is made again, uncounted, for the list as it is now (``policies.node_loss``
adds the entries)."""

from __future__ import annotations

from ddpjob_contract.status import Reason
from ddpjob_operator.transitions import Restart, Transition
from ddpjob_operator.view import View


def rule(v: View) -> Transition | None:
    """A rank not yet placed avoids a node the job no longer excludes (``status.excludedNodes`` cleared by the user,
    or expired): its pod's affinity cannot change, so the gang restarts, uncounted, with pods built for the list as
    it is now. Without this, a gang that had nowhere left to run waited on, whatever was cleared."""
    excluded = set(v.status.excluded_names)
    for pod in v.obs.current.values():
        freed = set(pod.avoids) - excluded
        if freed and not pod.node and not pod.terminating:
            cause = (f"rank {pod.rank}'s pod {pod.name}, not placed, was built to avoid {', '.join(sorted(freed))}, "
                     f"which the job no longer excludes: the gang is made again without it")  # fmt: skip
            return Restart(Reason.EXCLUSIONS_CLEARED, cause, v.job.spec.run_policy.backoff_limit, counted=False)
    return None
