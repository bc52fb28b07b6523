"""Pure: Kubernetes Events for the job's transitions.

Names are deterministic (job, uid, attempt, reason), so an operator that crashes and replays a
transition creates the same Event again and gets a harmless 409 instead of a duplicate.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ddpjob_operator import api
from ddpjob_operator.times import from_time

COMPONENT = "ddpjob-operator"


@dataclass(frozen=True)
class Event:
    reason: str
    message: str
    warning: bool = False
    key: str = ""
    """Tells apart events of one reason that may happen more than once in an attempt (a straggler)."""


def _name(name: str, uid: str, attempt: int, event: Event) -> str:
    suffix = f".{event.key.lower()}" if event.key else ""
    return f"{name}.{uid[:8]}.{attempt}.{event.reason.lower()}{suffix}"[:253]


def event_body(*, namespace: str, name: str, uid: str, attempt: int, event: Event, now: datetime) -> dict[str, Any]:
    stamp = from_time(now)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": _name(name, uid, attempt, event), "namespace": namespace},
        "involvedObject": {
            "apiVersion": api.API_VERSION,
            "kind": api.KIND,
            "name": name,
            "namespace": namespace,
            "uid": uid,
        },
        "reason": event.reason,
        "message": event.message[:1024],
        "type": "Warning" if event.warning else "Normal",
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": COMPONENT,
    }
