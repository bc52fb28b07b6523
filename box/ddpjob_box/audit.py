"""The box's apiserver audit log: who removed which pod, Service or PodGroup, and when.

Only removals are recorded (at the Metadata level: who, what, when, the answer): deletions of pods,
Services and PodGroups, and changes to PodGroups, whose deletion waits for the controller-manager to drop
their protection finalizer. The log stays small through a soak of hundreds of jobs. When a rank's pod
disappears, or a child outlives its job, this says whether the operator, kubelet, the garbage collector,
the namespace controller or a test acted, and when.

A benchmark may ask for more (``requests=True``): every request of the clients that are not the control plane's
own (its controllers, scheduler, nodes and service accounts), once each, when answered, so that an operator's
requests can be counted by verb and resource (``bench.peer_operator``).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  verbs: [delete, deletecollection]
  resources: [{group: "", resources: [pods, services]}, {group: scheduling.k8s.io, resources: [podgroups]}]
- level: Metadata
  verbs: [update, patch]
  resources: [{group: scheduling.k8s.io, resources: [podgroups]}]
- level: None
"""

REQUESTS_POLICY = POLICY.replace(
    "- level: None\n",
    """\
- level: None
  users: [system:kube-controller-manager, system:kube-scheduler, system:apiserver, system:kube-proxy]
- level: None
  userGroups: [system:serviceaccounts, system:nodes]
- level: Metadata
""",
).replace("omitStages: [RequestReceived]", "omitStages: [RequestReceived, ResponseStarted]")
"""Every request of the other clients (operators, tests, the benchmark), once, at ResponseComplete; removals as
in POLICY, whoever asks."""


def policy(*, requests: bool = False, accounts: tuple[str, ...] = ()) -> str:
    """POLICY, or REQUESTS_POLICY with ``requests``; ``accounts`` (service accounts, ``namespace:name``) have every
    request audited too, as the other clients do: an operator run from its chart (``bench.leader_cut``)."""
    text = REQUESTS_POLICY if requests else POLICY
    if not accounts:
        return text
    users = ", ".join(f"system:serviceaccount:{account}" for account in accounts)
    first_none = text.index("- level: None")
    return f"{text[:first_none]}- level: Metadata\n  users: [{users}]\n{text[first_none:]}"


def apiserver_flags(directory: Path, *, requests: bool = False, accounts: tuple[str, ...] = ()) -> list[str]:
    """The kube-apiserver flags that write the audit log under ``directory``, with its policy file (``policy``)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "audit-policy.yaml"
    path.write_text(policy(requests=requests, accounts=accounts))
    return [
        f"--audit-policy-file={path}",
        f"--audit-log-path={log_path(directory)}",
        "--audit-log-format=json",
        "--audit-log-maxsize=200",
        "--audit-log-maxbackup=4",
    ]


def log_path(directory: Path) -> Path:
    return directory / "audit.log"


def removals(log: Path, namespace: str, owner: str) -> list[str]:
    """One line per recorded request on an object in ``namespace`` named ``owner`` or ``owner-...`` (a job's
    Service, pods and PodGroups), and per deletecollection there: when it finished, who asked, the verb,
    the object, the answer's code."""
    if not log.exists():
        return []
    lines = []
    for raw in log.read_text(errors="replace").splitlines():
        try:
            event = json.loads(raw)
        except ValueError:  # a line cut short by a kill
            continue
        ref = event.get("objectRef") or {}
        name = ref.get("name")
        if ref.get("namespace") != namespace or (name and name != owner and not name.startswith(f"{owner}-")):
            continue
        what = f"{ref.get('resource', '?')}/{name or '*'}"
        user = (event.get("user") or {}).get("username", "?")
        code = (event.get("responseStatus") or {}).get("code", "?")
        lines.append(f"{event.get('stageTimestamp', '?')} {user} {event.get('verb', '?')} {what}: {code}")
    return lines


def received(log: Path, since: float) -> Iterator[tuple[dict[str, Any], float]]:
    """Each recorded request the apiserver received at or after ``since`` (seconds since the epoch), with that time,
    from the rotated files (``audit-<time>.log``, oldest first) and then the log itself; lines cut short by a kill
    are passed over."""
    rotated = sorted(log.parent.glob(f"{log.stem}-*{log.suffix}"))
    for raw in (line for path in (*rotated, log) if path.exists() for line in _lines(path)):
        try:
            event = json.loads(raw)
            when = datetime.fromisoformat(event.get("requestReceivedTimestamp", "")).timestamp()
        except ValueError:
            continue
        if when >= since:
            yield event, when


def _lines(path: Path) -> Iterator[str]:
    with path.open(errors="replace") as lines:  # streamed: a rotated log is 200 MB
        yield from lines


def requests(log: Path, *, since: float, user: str, skip_agents: tuple[str, ...] = ()) -> Counter[tuple[str, str]]:
    """How many requests ``user`` made, received at or after ``since`` (seconds since the epoch), by (verb, resource
    [/subresource]); those whose user agent starts with one of ``skip_agents`` are left out. Needs REQUESTS_POLICY."""
    counts: Counter[tuple[str, str]] = Counter()
    for event, _ in received(log, since):
        if (event.get("user") or {}).get("username") != user or event.get("stage") != "ResponseComplete":
            continue
        if str(event.get("userAgent", "")).startswith(skip_agents):
            continue
        ref = event.get("objectRef") or {}
        resource = ref.get("resource") or event.get("requestURI", "?").split("?")[0]
        if ref.get("subresource"):
            resource += "/" + ref["subresource"]
        counts[str(event.get("verb", "?")), resource] += 1
    return counts
