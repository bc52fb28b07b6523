"""How a job's ranks are placed: as one gang (a PodGroup per attempt, all or nothing) or one by one.

``spec.gangScheduling`` chooses; whether the cluster serves PodGroups decides what ``Auto`` gets.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ddpjob_contract.pods import POD_GROUP_API
from ddpjob_contract.status import Reason
from ddpjob_operator.api import GangScheduling
from ddpjob_operator.transitions import Finish, Transition
from ddpjob_operator.view import Placement, View

HOW_TO_SERVE = (
    f"Kubernetes 1.37 or later with the GenericWorkload feature gate on the apiserver and the scheduler, "
    f"and --runtime-config={POD_GROUP_API}=true"
)


def placement(mode: GangScheduling, served: bool) -> Placement:
    if mode is GangScheduling.DISABLED:
        return Placement.ONE_BY_ONE
    if served:
        return Placement.GANG
    return Placement.UNAVAILABLE if mode is GangScheduling.REQUIRED else Placement.ONE_BY_ONE


def condition(mode: GangScheduling, served: bool, replicas: int) -> tuple[bool, Reason, str]:
    """The GangScheduling condition, said once when the job is created."""
    match placement(mode, served):
        case Placement.GANG:
            return (
                True,
                Reason.GANG,
                f"each attempt's {replicas} pods are placed all or nothing (a PodGroup, minCount {replicas})",
            )
        case Placement.UNAVAILABLE:
            return False, Reason.GANG_UNAVAILABLE, unavailable()
    if mode is GangScheduling.DISABLED:
        return False, Reason.GANG_DISABLED, "spec.gangScheduling is Disabled: pods are placed one by one"
    return (
        False,
        Reason.GANG_NOT_SERVED,
        (
            f"the cluster does not serve PodGroups ({POD_GROUP_API}): pods are placed one by one, and ranks placed "
            f"while others wait hold their resources (gang scheduling needs {HOW_TO_SERVE})"
        ),
    )


def unavailable() -> str:
    return (
        f"spec.gangScheduling is Required, but the cluster does not serve PodGroups ({POD_GROUP_API}); "
        f"that needs {HOW_TO_SERVE}. Set spec.gangScheduling to Auto to place the pods one by one"
    )


_FIT = re.compile(r"minCount \((\d+)\) cannot be satisfied: (\d+) scheduled")
_NODES = re.compile(r"\d+/\d+ nodes are available")


def says_why(message: str) -> bool:
    """The scheduler's words name why no node takes a pod ('0/1 nodes are available: 1 Insufficient ...'), not
    only the gang's count ('minCount (2) cannot be satisfied: 0 scheduled, 1 remaining')."""
    return bool(_NODES.search(message))


def unplaced(replicas: int, said: Sequence[str]) -> str:
    """Why a gang waits, from what the scheduler said of its pods (rank order): how many of them fit now,
    and why no node takes more, in the scheduler's words."""
    fit = next((int(m.group(2)) for s in said if (m := _FIT.search(s))), None)
    nodes = next((s for s in said if _NODES.search(s) and not _FIT.search(s)), None)
    how = f"only {fit} fit now" if fit is not None else "the scheduler cannot place it yet"
    return f"the gang of {replicas} pods is placed all or nothing, and {how}: {nodes or said[0]}"


def rule(v: View) -> Transition | None:
    """spec.gangScheduling is Required and the cluster does not serve PodGroups: the job fails."""
    if v.placement is not Placement.UNAVAILABLE:
        return None
    return Finish(False, Reason.GANG_UNAVAILABLE, unavailable())
