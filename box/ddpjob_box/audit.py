"""The box's apiserver audit log: who deleted which pod, and when.

Only pod deletions are recorded (at the Metadata level: who, what, when, the answer), so the log stays
small through a soak of hundreds of jobs. When a rank's pod disappears and no log says why, this says
whether the operator, kubelet, the garbage collector, the namespace controller or a test deleted it.
"""

from __future__ import annotations

import json
from pathlib import Path

POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  verbs: [delete, deletecollection]
  resources: [{group: "", resources: [pods]}]
- level: None
"""


def apiserver_flags(directory: Path) -> list[str]:
    """The kube-apiserver flags that write the audit log under ``directory``, with its policy file."""
    directory.mkdir(parents=True, exist_ok=True)
    policy = directory / "audit-policy.yaml"
    policy.write_text(POLICY)
    return [
        f"--audit-policy-file={policy}",
        f"--audit-log-path={log_path(directory)}",
        "--audit-log-format=json",
        "--audit-log-maxsize=200",
        "--audit-log-maxbackup=1",
    ]


def log_path(directory: Path) -> Path:
    return directory / "audit.log"


def pod_deletions(log: Path, namespace: str, prefix: str) -> list[str]:
    """One line per deletion of a pod in ``namespace`` whose name starts with ``prefix`` (and per
    deletecollection of that namespace's pods): when it finished, who asked, which pod, the answer's code."""
    if not log.exists():
        return []
    lines = []
    for raw in log.read_text(errors="replace").splitlines():
        try:
            event = json.loads(raw)
        except ValueError:  # a line cut short by a kill
            continue
        ref = event.get("objectRef") or {}
        if ref.get("resource") != "pods" or ref.get("namespace") != namespace:
            continue
        pod = ref.get("name") or "(every pod)"
        if ref.get("name") and not pod.startswith(prefix):
            continue
        user = (event.get("user") or {}).get("username", "?")
        code = (event.get("responseStatus") or {}).get("code", "?")
        lines.append(f"{event.get('stageTimestamp', '?')} {user} {event.get('verb', '?')} {pod}: {code}")
    return lines
