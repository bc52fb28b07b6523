"""The box's audit log is read back as one line per pod deletion: when, who, which pod, the answer."""

from __future__ import annotations

import json
from pathlib import Path

from ddpjob_box import audit


def _event(verb: str, namespace: str, name: str | None, user: str, code: int) -> str:
    ref = {"resource": "pods", "namespace": namespace, **({"name": name} if name else {})}
    return json.dumps(
        {"verb": verb, "objectRef": ref, "user": {"username": user}, "responseStatus": {"code": code},
         "stageTimestamp": "2026-11-25T09:54:09.123456Z"}
    )  # fmt: skip


def test_only_this_jobs_pods_in_this_namespace_and_whole_namespace_deletions(tmp_path: Path) -> None:
    log = audit.log_path(tmp_path)
    log.write_text(
        "\n".join(
            [
                _event("delete", "soak", "chaos-1-6-1", "system:node:box-node", 200),
                _event("delete", "soak", "chaos-1-64-0", "ddpjob-operator", 200),  # another job, same prefix start
                _event("delete", "other", "chaos-1-6-0", "box-admin", 200),  # another namespace
                _event("deletecollection", "soak", None, "system:serviceaccount:kube-system:namespace-controller", 200),
                '{"verb": "delete", "objectRef": {"resource": "pods", "names',  # a line cut short by a kill
            ]
        )
    )
    assert audit.pod_deletions(log, "soak", "chaos-1-6-") == [
        "2026-11-25T09:54:09.123456Z system:node:box-node delete chaos-1-6-1: 200",
        "2026-11-25T09:54:09.123456Z system:serviceaccount:kube-system:namespace-controller deletecollection "
        "(every pod): 200",
    ]


def test_no_log_yet_means_no_deletions(tmp_path: Path) -> None:
    assert audit.pod_deletions(audit.log_path(tmp_path), "soak", "x-") == []


def test_the_policy_records_pod_deletions_only_and_the_flags_name_it(tmp_path: Path) -> None:
    flags = audit.apiserver_flags(tmp_path / "logs")
    policy = tmp_path / "logs" / "audit-policy.yaml"
    assert f"--audit-policy-file={policy}" in flags
    assert f"--audit-log-path={audit.log_path(tmp_path / 'logs')}" in flags
    assert "verbs: [delete, deletecollection]" in policy.read_text()
    assert policy.read_text().rstrip().endswith("- level: None")
