"""The box's audit log is read back as one line per removal: when, who, what, which object, the answer."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from ddpjob_box import audit


def _event(verb: str, namespace: str, resource: str, name: str | None, user: str, code: int) -> str:
    ref = {"resource": resource, "namespace": namespace, **({"name": name} if name else {})}
    return json.dumps(
        {"verb": verb, "objectRef": ref, "user": {"username": user}, "responseStatus": {"code": code},
         "stageTimestamp": "2026-11-25T09:54:09.123456Z"}
    )  # fmt: skip


def test_only_this_jobs_children_in_this_namespace_and_whole_namespace_deletions(tmp_path: Path) -> None:
    log = audit.log_path(tmp_path)
    gc = "system:serviceaccount:kube-system:generic-garbage-collector"
    log.write_text(
        "\n".join(
            [
                _event("delete", "soak", "pods", "chaos-1-6-1", "system:node:box-node", 200),
                _event("delete", "soak", "services", "chaos-1-6", gc, 200),
                _event("patch", "soak", "podgroups", "chaos-1-6-attempt-0", "system:kube-controller-manager", 200),
                _event("delete", "soak", "pods", "chaos-1-64-0", "ddpjob-operator", 200),  # another job
                _event("delete", "soak", "services", "chaos-1-64", gc, 200),  # its Service
                _event("delete", "other", "pods", "chaos-1-6-0", "box-admin", 200),  # another namespace
                _event("deletecollection", "soak", "pods", None, "system:serviceaccount:kube-system:x", 200),
                '{"verb": "delete", "objectRef": {"resource": "pods", "names',  # a line cut short by a kill
            ]
        )
    )
    at = "2026-11-25T09:54:09.123456Z"
    assert audit.removals(log, "soak", "chaos-1-6") == [
        f"{at} system:node:box-node delete pods/chaos-1-6-1: 200",
        f"{at} {gc} delete services/chaos-1-6: 200",
        f"{at} system:kube-controller-manager patch podgroups/chaos-1-6-attempt-0: 200",
        f"{at} system:serviceaccount:kube-system:x deletecollection pods/*: 200",
    ]


def test_no_log_yet_means_no_removals(tmp_path: Path) -> None:
    assert audit.removals(audit.log_path(tmp_path), "soak", "x") == []


def test_the_policy_records_removals_only_and_the_flags_name_it(tmp_path: Path) -> None:
    flags = audit.apiserver_flags(tmp_path / "logs")
    policy = tmp_path / "logs" / "audit-policy.yaml"
    assert f"--audit-policy-file={policy}" in flags
    assert f"--audit-log-path={audit.log_path(tmp_path / 'logs')}" in flags
    assert "verbs: [delete, deletecollection]" in policy.read_text()
    assert policy.read_text().rstrip().endswith("- level: None")


def _request(verb: str, resource: str, user: str, agent: str, received: str, subresource: str = "") -> str:
    ref = {"resource": resource, **({"subresource": subresource} if subresource else {})}
    return json.dumps({"stage": "ResponseComplete", "verb": verb, "objectRef": ref, "user": {"username": user},
                       "userAgent": agent, "requestReceivedTimestamp": received})  # fmt: skip


def test_requests_are_counted_by_verb_and_resource_for_one_user_since_a_time_without_the_skipped_agents(
    tmp_path: Path,
) -> None:
    log = audit.log_path(tmp_path)
    log.write_text("\n".join([
        _request("create", "pods", "box-admin", "kopf/1", "2026-11-26T09:00:01Z"),
        _request("create", "pods", "box-admin", "python/3", "2026-11-26T09:00:02.5Z"),
        _request("update", "ddpjobs", "box-admin", "python/3", "2026-11-26T09:00:03Z", subresource="status"),
        _request("create", "pods", "box-admin", "python/3", "2026-11-26T08:59:59Z"),  # before
        _request("create", "ddpjobs", "box-admin", "ddpjob-bench", "2026-11-26T09:00:04Z"),  # the load generator
        _request("create", "endpointslices", "system:serviceaccount:kube-system:x", "kcm", "2026-11-26T09:00:05Z"),
        '{"stage": "ResponseComplete", "verb": "create", "objectRef',  # a line cut short by a kill
    ]))  # fmt: skip
    since = datetime(2026, 11, 26, 9, 0, 0, tzinfo=UTC).timestamp()
    counted = audit.requests(log, since=since, user="box-admin", skip_agents=("ddpjob-bench",))
    assert counted == {("create", "pods"): 2, ("update", "ddpjobs/status"): 1}


def test_requests_are_read_from_the_rotated_logs_too_oldest_first(tmp_path: Path) -> None:
    log = audit.log_path(tmp_path)
    # the apiserver's rotation (200 MB) renames the log to audit-<time>.log and starts a new one
    (tmp_path / "audit-2026-11-26T09-00-02.000.log").write_text(
        _request("create", "pods", "box-admin", "kopf/1", "2026-11-26T09:00:01Z") + "\n"
    )
    log.write_text(_request("delete", "pods", "box-admin", "kopf/1", "2026-11-26T09:00:03Z") + "\n")
    since = datetime(2026, 11, 26, 9, 0, 0, tzinfo=UTC).timestamp()
    assert [e["verb"] for e, _ in audit.received(log, since)] == ["create", "delete"]
    assert audit.requests(log, since=since, user="box-admin") == {("create", "pods"): 1, ("delete", "pods"): 1}


def test_the_requests_policy_audits_every_other_client_once_and_still_every_removal(tmp_path: Path) -> None:
    audit.apiserver_flags(tmp_path / "logs", requests=True)
    policy = (tmp_path / "logs" / "audit-policy.yaml").read_text()
    assert "omitStages: [RequestReceived, ResponseStarted]" in policy
    assert policy.index("verbs: [delete, deletecollection]") < policy.index("userGroups: [system:serviceaccounts")
    assert policy.rstrip().endswith("- level: Metadata")


def test_an_account_named_has_every_request_audited_before_the_service_accounts_are_left_out() -> None:
    text = audit.policy(requests=True, accounts=("ddpjob-system:ddpjob",))
    named = text.index("users: [system:serviceaccount:ddpjob-system:ddpjob]")
    assert text.index("verbs: [delete, deletecollection]") < named < text.index("userGroups: [system:serviceaccounts")
    assert audit.policy(requests=True) == audit.REQUESTS_POLICY and audit.policy() == audit.POLICY
