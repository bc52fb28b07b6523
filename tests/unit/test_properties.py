"""Hypothesis: any spec the CRD accepts parses, builds valid-looking pods, and plans without error
for any state its pods may be in."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddpjob_contract.pods import RESERVED_ENV
from ddpjob_contract.status import Phase
from ddpjob_operator import api, builders
from ddpjob_operator.api import parse_job
from ddpjob_operator.lifecycle import plan
from ddpjob_operator.status import JobStatus, PodView, parse_status

T0 = datetime(2026, 1, 1, tzinfo=UTC)

dns_label = st.from_regex(r"\A[a-z]([-a-z0-9]{0,20}[a-z0-9])?\Z")
env_name = st.from_regex(r"\A[A-Z][A-Z0-9_]{0,12}\Z").filter(lambda n: n not in RESERVED_ENV)


@st.composite
def specs(draw: st.DrawFn) -> dict[str, Any]:
    """Valid DDPJob specs, in the shape the CRD admits (defaults left out at random)."""
    gpus = draw(st.sampled_from([None, 0, 1, 2, 8]))
    trainer: dict[str, Any] = {"name": draw(dns_label), "image": draw(st.from_regex(r"\A[a-z0-9./:-]{1,30}\Z"))}
    if gpus is not None:
        trainer["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    if draw(st.booleans()):
        trainer["env"] = [{"name": n, "value": "v"} for n in draw(st.lists(env_name, max_size=4, unique=True))]
    pod_spec: dict[str, Any] = {"containers": [trainer]}
    if draw(st.booleans()):
        pod_spec["nodeSelector"] = {"pool": "gpu"}
    if draw(st.booleans()):
        pod_spec["containers"].append({"name": "sidecar", "image": "busybox"})
    spec: dict[str, Any] = {"replicas": draw(st.integers(1, 12)), "template": {"spec": pod_spec}}
    nproc = draw(st.sampled_from([None, 1, 2, 8, "auto"]))
    if nproc is not None:
        spec["nprocPerNode"] = nproc
    if draw(st.booleans()):
        spec["port"] = draw(st.integers(1, 20000))
        spec["metricsPort"] = draw(st.integers(30000, 60000))
    run_policy: dict[str, Any] = {}
    if draw(st.booleans()):
        run_policy["backoffLimit"] = draw(st.integers(0, api.MAX_BACKOFF_LIMIT))
    if draw(st.booleans()):
        run_policy["restartPolicy"] = draw(st.sampled_from([p.value for p in api.RestartPolicy]))
        if run_policy["restartPolicy"] == "ExitCode" and draw(st.booleans()):
            run_policy["retryableExitCodes"] = draw(st.lists(st.integers(1, 255), max_size=4, unique=True))
    for key, lo in (("activeDeadlineSeconds", 1), ("ttlSecondsAfterFinished", 0)):
        if draw(st.booleans()):
            run_policy[key] = draw(st.integers(lo, 10_000))
    if draw(st.booleans()):
        run_policy["cleanPodPolicy"] = draw(st.sampled_from([p.value for p in api.CleanPodPolicy]))
    if draw(st.booleans()):
        run_policy["suspend"] = draw(st.booleans())
    if run_policy:
        spec["runPolicy"] = run_policy
    if draw(st.booleans()):
        spec["checkpoint"] = draw(st.sampled_from([{"claimName": "ckpt"}, {"emptyDir": {}, "mountPath": "/c"}]))
    if draw(st.booleans()):
        spec["waitForMasterSeconds"] = draw(st.integers(0, 600))
    return spec


def pod_states(replicas: int, attempt: int) -> st.SearchStrategy[list[PodView]]:
    one = st.builds(
        PodView,
        name=st.just("x"),
        rank=st.one_of(st.none(), st.integers(0, replicas + 1)),
        attempt=st.one_of(st.none(), st.integers(max(0, attempt - 1), attempt + 1)),
        phase=st.sampled_from(["Pending", "Running", "Succeeded", "Failed", "Unknown"]),
        terminating=st.booleans(),
        exit_code=st.one_of(st.none(), st.integers(0, 255)),
        reason=st.sampled_from(["", "Evicted"]),
    )
    return st.lists(one, max_size=replicas + 3).map(
        lambda ps: [PodView(**{**p.__dict__, "name": f"p{i}"}) for i, p in enumerate(ps)]
    )


statuses = st.builds(
    JobStatus,
    phase=st.sampled_from(list(Phase)),
    attempt=st.integers(0, 5),
    restarts=st.integers(0, 5),
    launched_attempt=st.integers(-1, 5),
    start_time=st.one_of(st.none(), st.just(T0)),
    completion_time=st.one_of(st.none(), st.just(T0)),
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=specs(), name=dns_label)
def test_every_admissible_spec_parses_and_builds_pods_that_honour_the_contract(spec: dict[str, Any], name: str) -> None:
    j = parse_job({"metadata": {"name": name, "namespace": "ns", "uid": "u"}, "spec": spec})
    assert builders.service(j)["spec"]["clusterIP"] == "None"
    names = set()
    for rank in range(j.spec.replicas):
        pod = builders.pod(j, rank, 0, gang=False)
        names.add(pod["metadata"]["name"])
        assert len(pod["spec"]["hostname"]) <= 63
        env = [e["name"] for e in pod["spec"]["containers"][0]["env"]]
        assert len(env) == len(set(env)), "no duplicate env names"
        values = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert int(values["WORLD_SIZE"]) == j.spec.replicas * j.spec.nproc_per_node
        assert ("RANK" in values) == (j.spec.nproc_per_node == 1)
    assert len(names) == j.spec.replicas


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), spec=specs(), status=statuses, elapsed=st.integers(0, 20_000))
def test_planning_never_fails_and_never_creates_over_an_existing_pod(
    data: st.DataObject, spec: dict[str, Any], status: JobStatus, elapsed: int
) -> None:
    j = parse_job({"metadata": {"name": "job", "namespace": "ns", "uid": "u", "generation": 1}, "spec": spec})
    pods = data.draw(pod_states(j.spec.replicas, status.attempt))
    p = plan(j, status, pods, T0 + timedelta(seconds=elapsed))
    existing = {pod.rank for pod in pods if pod.attempt == p.status.attempt}
    assert not set(p.create_ranks) & existing
    assert all(0 <= r < j.spec.replicas for r in p.create_ranks)
    if p.create_ranks:
        assert not any(pod.attempt != p.status.attempt for pod in pods), "old pods go first"
    assert p.status.attempt >= status.attempt and p.status.restarts >= status.restarts
    assert p.status.restarts <= max(status.restarts, j.spec.run_policy.backoff_limit)
    if status.phase.finished:
        assert p.status.phase is status.phase and not p.create_ranks
    assert parse_status(p.status.to_dict()) == p.status
    assert p.requeue_after is None or p.requeue_after >= 0 or p.status.phase.finished
