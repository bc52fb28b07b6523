"""The benchmarks' arithmetic: statistics, the apiserver histogram, job latencies, profiles, the window."""

from __future__ import annotations

import math

import pytest

from bench import apiserver, common, ddp_cpu, operator_scale, workload


def _series(verb: str, resource: str, subresource: str, buckets: dict[str, int], total: float) -> str:
    labels = f'resource="{resource}",scope="resource",subresource="{subresource}",verb="{verb}",version="v1"'
    lines = [f'apiserver_request_duration_seconds_bucket{{{labels},le="{le}"}} {n}' for le, n in buckets.items()]
    count = buckets["+Inf"]
    lines += [f"apiserver_request_duration_seconds_sum{{{labels}}} {total}",
              f"apiserver_request_duration_seconds_count{{{labels}}} {count}"]  # fmt: skip
    return "\n".join(lines)


METRICS = "\n".join([
    "# HELP apiserver_request_duration_seconds Response latency distribution in seconds.",
    "# TYPE apiserver_request_duration_seconds histogram",
    _series("POST", "pods", "", {"0.005": 0, "0.025": 50, "0.05": 100, "+Inf": 100}, 2.5),
    _series("PUT", "ddpjobs", "status", {"0.005": 10, "0.025": 10, "0.05": 10, "+Inf": 10}, 0.03),
    _series("LIST", "pods", "", {"+Inf": 7}, 0.1),
    "",
])  # fmt: skip


def test_apiserver_durations_are_grouped_by_verb_and_resource_with_subresource():
    durations = apiserver.request_durations(METRICS)
    assert set(durations) == {("POST", "pods"), ("PUT", "ddpjobs/status"), ("LIST", "pods")}
    assert durations[("POST", "pods")].count == 100
    assert durations[("POST", "pods")].mean == pytest.approx(0.025)


def test_quantiles_interpolate_within_the_bucket_like_histogram_quantile():
    h = apiserver.request_durations(METRICS)[("POST", "pods")]
    assert h.quantile(0.5) == pytest.approx(0.025)  # rank 50 is the top of the second bucket
    assert h.quantile(0.75) == pytest.approx(0.0375)  # half-way into the (0.025, 0.05] bucket
    assert math.isnan(apiserver.Histogram().quantile(0.5))


def test_only_mutating_verbs_are_summed_per_verb():
    verbs = apiserver.by_verb(apiserver.request_durations(METRICS))
    assert set(verbs) == {"POST", "PUT"}


def test_the_difference_of_two_scrapes_counts_only_what_happened_between():
    before = apiserver.request_durations(METRICS)
    after = apiserver.request_durations(
        "\n".join([METRICS, ""]).replace("} 100\n", "} 130\n").replace("} 50\n", "} 80\n")
    )
    during = apiserver.difference(after, before)
    assert during[("POST", "pods")].count == 30
    assert during[("POST", "pods")].buckets[0.025] == 30
    assert during[("PUT", "ddpjobs/status")].count == 0


def test_percentile_interpolates_and_spread_reports_median_and_range():
    assert common.percentile([1, 2, 3, 4], 50) == 2.5
    assert common.percentile([5], 99) == 5
    s = common.Spread.of([1.0, 3.0, 2.0])
    assert (s.median, s.low, s.high) == (2.0, 1.0, 3.0)
    assert common.paired_ratios([2.0, 3.0], [1.0, 3.0]).values == [2.0, 1.0]


def test_both_clocks_are_compared_pair_by_pair():
    runs = {
        "a": [{"img_per_s": 10.0, "img_per_cpu_s": 5.0}, {"img_per_s": 20.0, "img_per_cpu_s": 6.0}],
        "b": [{"img_per_s": 10.0, "img_per_cpu_s": 5.0}, {"img_per_s": 10.0, "img_per_cpu_s": 5.0}],
    }
    ratios = common.compare(runs, "a", "b")
    assert ratios["img_per_s"].values == [1.0, 2.0]
    assert ratios["img_per_cpu_s"].values == [1.0, 1.2]


def test_alternation_flips_the_order_every_repetition():
    order: list[str] = []
    common.alternate(3, {n: (lambda n=n: order.append(n) or {"img_per_s": 1.0}) for n in "AB"})
    assert order == ["A", "B", "B", "A", "A", "B"]


def test_the_window_spans_exactly_the_measured_steps():
    events: list[str] = []
    w = common.Window(2, 3, sync=lambda: events.append("sync"), on_open=lambda: events.append("open"),
                      on_close=lambda: events.append("close"))  # fmt: skip
    for step in range(1, 6):
        w.step_done(step)
    assert events == ["sync", "open", "close", "sync"]
    assert w.seconds > 0


def test_a_window_that_never_closed_says_how_many_steps_it_needed():
    w = common.Window(2, 3)
    w.step_done(2)
    with pytest.raises(common.BenchError, match="fewer than 5 steps"):
        _ = w.seconds


def test_job_latency_runs_from_the_post_to_the_last_pod_and_throughput_over_the_whole_span():
    jobs = [operator_scale.JobTimes(sent=float(i), created=i + 0.01, done=i + 1.0 + i / 10) for i in range(10)]
    jobs.append(operator_scale.JobTimes(sent=10.0, created=10.01))  # never done
    f = operator_scale.summarize_jobs(jobs)
    assert (f["jobs"], f["done"]) == (11, 10)
    assert f["p50_s"] == pytest.approx(1.45)
    assert f["max_s"] == pytest.approx(1.9)
    assert f["sustained_jobs_per_s"] == pytest.approx(10 / 10.9)
    assert f["created_jobs_per_s"] == pytest.approx(1.0)


def test_profile_summary_counts_each_function_once_per_stack_and_names_the_leaf_as_self():
    collapsed = (
        "run (asyncio/events.py:80);reconcile (ddpjob_operator/controller.py:40);request (urllib3/pool.py:10) 6\n"
        "run (asyncio/events.py:80);reconcile (ddpjob_operator/controller.py:41) 4\n"
    )
    total, inclusive, own = operator_scale.profile_summary(collapsed)
    assert total == 10
    assert dict(inclusive)["reconcile (ddpjob_operator/controller.py)"] == pytest.approx(100.0)
    assert own[0] == ("request (urllib3/pool.py)", pytest.approx(60.0))


def test_weak_scaling_efficiency_compares_twice_the_ranks_with_twice_the_throughput():
    def runs(ips: list[float]) -> list[dict[str, object]]:
        return [{"img_per_s": x, "img_per_cpu_s": x / 2, "fwd_bwd_ms": [10.0, 20.0]} for x in ips]

    ratios, efficiency, rows = ddp_cpu.summarize(
        {
            "trainer x1": runs([100, 100]),
            "textbook x1": runs([100, 50]),
            "trainer x2": runs([180, 180]),
            "textbook x2": runs([200, 100]),
        },
        [1, 2],
    )
    assert ratios[1]["img_per_s"].values == [1.0, 2.0]
    assert efficiency["trainer"]["img_per_s"].median == pytest.approx(0.9)
    assert efficiency["textbook"]["img_per_s"].median == pytest.approx(1.0)
    assert efficiency["trainer"]["img_per_cpu_s"].median == pytest.approx(1.8)  # CPU per image, rank for rank
    assert rows[0][:3] == [1, "trainer", "15.0"]  # p50 of every measured step pooled


def test_presets_give_the_classic_sizes_and_flags_override_them():
    import argparse

    parser = argparse.ArgumentParser()
    workload.add_arguments(parser)
    w = workload.from_arguments(parser.parse_args(["--preset", "classic", "--batch-size", "64"]))
    assert (w.model, w.image_size, w.batch_size) == ("resnet50", 224, 64)
    assert "--steps=25" in w.trainer_args()
    assert w.env == {"OMP_NUM_THREADS": "1"}


def test_a_profile_can_be_narrowed_to_the_stacks_through_one_function():
    collapsed = (
        "select (selectors.py:10) 90\n"
        "_reconcile (ddpjob_operator/controller.py:44);read (ssl.py:1) 3\n"
        "_reconcile (ddpjob_operator/controller.py:74);read (ssl.py:1) 7\n"
    )
    total, _, own = operator_scale.profile_summary(collapsed, within="_reconcile")
    assert total == 10
    assert own == [("read (ssl.py)", pytest.approx(100.0))]


def test_statement_shares_label_each_line_of_the_function_with_its_source(tmp_path):
    source = tmp_path / "controller.py"
    source.write_text("def _reconcile():\n    get()\n    create()\n")
    collapsed = (
        "_reconcile (ddpjob_operator/controller.py:2);read (ssl.py:1) 1\n"
        "_reconcile (ddpjob_operator/controller.py:3);read (ssl.py:1) 3\n"
    )
    shares = operator_scale.statement_shares(collapsed, "_reconcile", source)
    assert shares == [("controller.py:3 `create()`", 75.0), ("controller.py:2 `get()`", 25.0)]


def test_the_peer_benchmark_counts_requests_per_job_without_watches_and_pairs_its_ratios() -> None:
    from bench import peer_operator

    counts = {"create pods": 40.0, "update ddpjobs/status": 20.0, "watch pods": 3.0, "WATCH pods": 2.0}
    assert peer_operator.per_job(counts, 10) == {"create pods": 4.0, "update ddpjobs/status": 2.0}
    assert peer_operator.ratio_spread([30.0, 20.0, 40.0], [20.0, 20.0, 20.0]) == (1.5, 1.0, 2.0)
    assert math.isnan(peer_operator.ratio_spread([1.0], [0.0])[0])


def test_the_peer_benchmarks_profile_puts_each_stack_in_its_first_area_and_counts_http_and_json_across() -> None:
    from bench import peer_operator

    raw = "\n".join([
        "_worker (futures/thread.py:1);Controller._create_pods.<locals>.create (c.py:2);Kube._call (k.py:3) 3",
        "_worker (futures/thread.py:1);Controller.reconcile (c.py:1);_write_status (c.py:9);Kube._call (k.py:3) 1",
        "ListWatch._run (l.py:1);loads (json/__init__.py:1);raw_decode (json/decoder.py:2) 2",
        "select (selectors.py:1) 2",
    ])  # fmt: skip
    total, areas, across = peer_operator.profile_areas(raw)
    assert total == 8
    assert dict(areas) == {"creating pods (POST; the create pool)": 37.5, "status writes (PUT)": 12.5,
                           "the watches, pods and DDPJobs (read, decode, slim, wake)": 25.0, "other": 25.0}  # fmt: skip
    assert dict(across) == {"HTTP requests (client, TLS, headers), in all areas": 50.0,
                            "JSON decoding, in all areas": 25.0}  # fmt: skip


def test_the_peer_benchmark_splits_the_machines_cpu_per_job_by_process_and_keeps_the_rest() -> None:
    from bench import peer_operator
    from bench.operator_scale import MACHINE

    runs = [
        {"done": 100, "cpu_s": {MACHINE: 8.0, "kube-apiserver": 3.0, "operator": 1.0}},
        {"done": 200, "cpu_s": {MACHINE: 20.0, "kube-apiserver": 8.0, "operator": 2.0}},
        {"done": 100, "cpu_s": {MACHINE: 9.0, "kube-apiserver": 3.5, "operator": 1.2}},
    ]
    split = peer_operator.cpu_by_process(runs)
    assert list(split) == ["kube-apiserver", "operator", "the rest of the machine"]
    assert split["kube-apiserver"] == 35.0 and split["operator"] == 10.0  # ms per job, medians of 30/40/35, 10/10/12
    assert split["the rest of the machine"] == pytest.approx(43.0)  # medians of 40, 50, 43


def test_a_go_cpu_profile_is_taken_in_slices_until_stopped_and_each_slice_is_kept(tmp_path) -> None:
    import threading
    import time

    from bench import go_profile

    asked: list[str] = []
    second = threading.Event()

    def fetch(path: str) -> bytes:
        asked.append(path)
        if len(asked) == 2:
            second.set()
        time.sleep(0.01)  # the real one takes SLICE_S seconds
        return f"slice {len(asked)}".encode()

    profile = go_profile.CpuProfile(fetch, tmp_path, "apiserver")
    assert second.wait(10)
    paths = profile.stop()
    assert len(paths) >= 2 and paths == sorted(tmp_path.glob("apiserver.*.pprof"))
    assert [p.read_text() for p in paths[:2]] == ["slice 1", "slice 2"]
    assert set(asked) == {f"/debug/pprof/profile?seconds={go_profile.SLICE_S}"}
    assert profile.stop() == paths, "stopped: no slice after"


def test_the_peer_node_loss_job_is_ours_as_a_master_and_a_worker_on_nodes_of_their_own() -> None:
    from bench import node_loss, node_loss_peer

    body = node_loss_peer.pytorchjob("peer-0", "ckpt")
    ours = node_loss.job_body("peer-0", "ckpt")["spec"]["template"]["spec"]["containers"][0]
    specs = body["spec"]["pytorchReplicaSpecs"]
    assert sorted(specs) == ["Master", "Worker"] and all(s["replicas"] == 1 for s in specs.values())
    pod = specs["Worker"]["template"]["spec"]
    (trainer,) = pod["containers"]
    assert trainer["args"] == ours["args"] and trainer["image"] == ours["image"]
    assert trainer["volumeMounts"][0]["mountPath"] == "/checkpoints" and pod["volumes"][0]["persistentVolumeClaim"] == {
        "claimName": "ckpt"
    }
    (spread,) = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert spread["labelSelector"]["matchLabels"] == {node_loss_peer.JOB_LABEL: "peer-0"}


def test_the_scale_benchmarks_jobs_ask_the_same_of_kueue_on_both_sides() -> None:
    from bench import scale

    ours, theirs = scale.ddpjob_body(8, 60)("j00001"), scale.pytorchjob_body(8, 60)("j00001")
    assert ours["spec"]["replicas"] == 8
    specs = theirs["spec"]["pytorchReplicaSpecs"]
    assert specs["Master"]["replicas"] + specs["Worker"]["replicas"] == 8
    templates = [ours["spec"]["template"], specs["Master"]["template"], specs["Worker"]["template"]]
    for body in (ours, theirs):
        assert body["metadata"]["labels"] == {"kueue.x-k8s.io/queue-name": scale.LOCAL_QUEUE}
    for template in templates:
        assert template["metadata"]["annotations"] == {"pod-complete.stage.kwok.x-k8s.io/delay": "60s"}
        assert template["spec"]["containers"][0]["resources"]["limits"] == {scale.GPU: "1"}
    (_, flavor), (_, cluster_queue) = scale.queues(1000)
    quota = cluster_queue["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
    assert {"name": scale.GPU, "nominalQuota": 1000} in quota and flavor["spec"]["nodeLabels"] == {"type": "kwok"}


def test_the_scale_benchmark_counts_an_operators_requests_by_its_user_agent_without_watches(tmp_path) -> None:
    import json

    from bench import scale

    def event(agent: str, verb: str, resource: str, at: str, subresource: str = "", code: int = 201) -> str:
        ref = {"resource": resource, **({"subresource": subresource} if subresource else {})}
        return json.dumps({"stage": "ResponseComplete", "userAgent": agent, "verb": verb, "objectRef": ref,
                           "requestReceivedTimestamp": at, "responseStatus": {"code": code}})  # fmt: skip

    log = tmp_path / "audit.log"
    log.write_text("\n".join([
        event("ddpjob-operator/op-1", "create", "pods", "2026-11-29T10:00:01Z"),
        event("kopf/1.38", "patch", "ddpjobs", "2026-11-29T10:00:02Z", "status"),
        event("ddpjob-operator/op-1", "watch", "workloads", "2026-11-29T10:00:02Z"),
        event("kwok/v0.8.0", "patch", "pods", "2026-11-29T10:00:03Z", "status"),
        event("ddpjob-operator/op-1", "create", "events", "2026-11-29T10:00:04Z", code=409),
        event("training-operator/v0.0.0", "create", "pods", "2026-11-29T10:00:03Z"),
        event("ddpjob-operator/op-1", "create", "pods", "2026-11-29T10:00:09Z"),  # after the window
    ]))  # fmt: skip
    since, until = 1795946400.0, 1795946405.0  # 10:00:00 to 10:00:05 UTC
    ours = scale.requests_by(log, since, until, ("ddpjob-operator", "kopf/"))
    assert ours == {("create", "pods"): 1, ("patch", "ddpjobs/status"): 1, ("create", "events (409)"): 1}
    assert scale.requests_by(log, since, until, ("training-operator",)) == {("create", "pods"): 1}


def test_the_scale_benchmarks_workload_times_follow_admission_eviction_and_the_end() -> None:
    from bench import scale

    watch = object.__new__(scale.WorkloadWatch)
    watch.jobs = {}

    def seen(at: float, **conditions: bool) -> None:
        said = [{"type": t, "status": str(v)} for t, v in conditions.items()]
        meta = {"resourceVersion": str(at), "ownerReferences": [{"name": "j1"}]}
        watch._seen({"type": "MODIFIED", "object": {"metadata": meta, "status": {"conditions": said}}}, at)

    seen(1.0, QuotaReserved=True)
    seen(2.0, Admitted=True)
    seen(3.0, Admitted=False, Evicted=True)
    assert (watch.jobs["j1"].admitted, watch.jobs["j1"].evictions) == (0.0, 1)
    seen(4.0, Admitted=True)
    seen(5.0, Admitted=True, Finished=True)
    assert (watch.jobs["j1"].admitted, watch.jobs["j1"].finished) == (4.0, 5.0)


def test_the_many_jobs_benchmarks_jobs_run_on_the_simulated_nodes_and_leave_no_pod_behind() -> None:
    from bench import many_jobs

    job = many_jobs.job_body(1, 1)("done-00001")
    template = job["spec"]["template"]
    assert job["spec"]["runPolicy"] == {"cleanPodPolicy": "All"} and job["spec"]["replicas"] == 1
    assert template["metadata"]["annotations"] == {"pod-complete.stage.kwok.x-k8s.io/delay": "1s"}
    assert template["spec"]["nodeSelector"] == {"type": "kwok"}
    assert template["spec"]["tolerations"][0]["key"] == "kwok.x-k8s.io/node"


def test_a_burst_reads_the_takeover_the_standbys_early_writes_and_each_pods_creators_from_the_audit_log() -> None:
    from bench.takeover import read_burst

    def event(who: str, verb: str, resource: str, name: str, code: int = 201) -> dict[str, object]:
        return {"stage": "ResponseComplete", "userAgent": f"ddpjob-operator/{who}", "verb": verb,
                "objectRef": {"resource": resource, "name": name}, "responseStatus": {"code": code}}  # fmt: skip

    killed = 100.0
    events = [
        (event("a", "create", "pods", "j0-0"), 99.0),
        (event("a", "create", "pods", "j0-1"), 99.5),
        (event("b", "update", "leases", "ddpjob-operator", 409), 101.0),  # tried while a's lease held: refused
        (event("b", "update", "leases", "ddpjob-operator", 200), 114.0),  # took it
        (event("b", "create", "pods", "j0-1", 409), 114.5),  # already there: refused, not a second pod
        (event("b", "create", "pods", "j1-0"), 115.0),
        (event("b", "create", "pods", "j1-1"), 115.1),
        (event("b", "get", "ddpjobs", "j1"), 115.2),
        (event("a", "create", "pods", "ddpjob-in-place-probe"), 98.0),  # each leader's probe: no job's pod
        (event("b", "create", "pods", "ddpjob-in-place-probe"), 114.2),
    ]
    statuses = {"j0": {"phase": "Succeeded"}, "j1": {"phase": "Succeeded", "restarts": 0}}
    clean = read_burst(events, "a", "b", killed, statuses)
    assert (clean.acquired_s, clean.took_over_s, clean.succeeded, clean.jobs) == (14.0, 14.2, 2, 2)
    assert clean.restarted == clean.standby_writes == clean.pods_by_both == clean.created_twice == []
    split = [*events, (event("b", "create", "pods", "j0-0"), 99.8), (event("b", "patch", "ddpjobs", "j0"), 99.9)]
    bad = read_burst(split, "a", "b", killed, {**statuses, "j1": {"phase": "Failed", "restarts": 1}})
    assert bad.created_twice == ["j0-0"] and bad.pods_by_both == ["j0"] and bad.restarted == ["j1"]
    assert bad.standby_writes == ["-0.20s create pods/j0-0 -> 201", "-0.10s patch ddpjobs/j0 -> 201"]
    assert bad.succeeded == 1
