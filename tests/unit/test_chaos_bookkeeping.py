"""The chaos soak's bookkeeping: which runs went on side by side, the replay command, the summary."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from bench.chaos import invariants, runner
from bench.chaos.faults import ENDING, FAULTS, drawn
from bench.chaos.invariants import held, never_started, outcome_as_promised, too_late, wait_while_whole
from bench.chaos.job import STEPS, Run, backoff_limit
from bench.chaos.runner import Overlaps, log_excerpt, summary
from bench.common import STOPPING, wait_until


def test_a_run_records_every_run_alive_at_some_moment_of_it_and_no_other() -> None:
    overlaps = Overlaps()
    with overlaps.running(0):
        with overlaps.running(1):
            pass
        with overlaps.running(2), overlaps.running(3):
            pass
    with overlaps.running(4):
        pass
    assert overlaps.seen == {0: {1, 2, 3}, 1: {0}, 2: {0, 3}, 3: {0, 2}, 4: set()}


def test_the_replay_command_runs_a_run_again_with_those_beside_it() -> None:
    assert Run(1, 37, ["kill-rank"]).replay == "python -m bench.chaos --replay 1:37"
    assert Run(1, 37, [], alongside=[38, 35]).replay == "python -m bench.chaos --replay 1:35,1:37,1:38"


def test_the_summary_counts_a_skipped_fault_apart_from_the_injected_ones() -> None:
    runs = [
        Run(1, 0, ["kill-rank", "restart-etcd"], outcome="Succeeded", restarts=1),
        Run(1, 1, ["kill-rank"], outcome="Succeeded", restarts=0, skipped=["kill-rank"]),
        Run(1, 2, ["hang-rank"], outcome="timeout", violations=["timed out"]),
    ]
    text = summary(runs, parallel=3, wall_seconds=90)
    assert "| kill-rank | 1 | 1 |" in text
    assert "| restart-etcd | 1 | 0 |" in text
    assert "| 3 | 3 | 1 | 2 | 1 | 1.5 min |" in text
    assert "started again: none.\n" in text
    assert text.endswith("The armed operator exited at its point 0 times (none).")
    again = summary(
        runs, 3, 90, ["kube-scheduler exited with code 1 after 9s; ...", "kube-scheduler exited with code 1 ..."]
    )
    assert "started again: kube-scheduler 2.\n" in again, again
    cache = "Pod updated on a different node than previously added to. Scheduler cache is corrupted"
    said = [
        f'kube-scheduler exited with code 1 after {s}s (its last error: "{cache}"); the box started it again ...'
        for s in (9, 70)
    ]
    causes = summary(runs, 3, 90, [*said, "etcd exited with code 2 after 1s; ..."])
    assert (
        "started again: etcd 1, kube-scheduler 2.\n"
        f'Their last error before they exited:\n- kube-scheduler, 2 times: "{cache}"\n'
    ) in causes, causes
    fired = summary(runs, 3, 90, fired=["pod-created:2", "pod-deleted:1", "pod-created:2"])
    assert fired.endswith("exited at its point 3 times (pod-created:2 2, pod-deleted:1 1)."), fired


def test_a_deletion_is_the_last_fault_of_its_run_and_every_kind_is_drawn() -> None:
    seen = set()
    for index in range(200):
        _, faults = drawn(1, index)
        seen.update(faults)
        first = next((i for i, f in enumerate(faults) if f in ENDING), len(faults))
        assert all(f in ENDING for f in faults[first:]), f"a fault after a deletion: {faults}"
        assert 1 <= len(faults) <= 3 and len(set(faults)) == len(faults)
    assert seen == set(FAULTS)


def test_with_kueue_the_draw_adds_preemption_and_a_kueue_restart_and_leaves_the_plain_draws_alone() -> None:
    from bench.chaos.faults import KUEUE_FAULTS
    from bench.chaos.job import chaos_job

    queued = {f for index in range(200) for f in drawn(1, index, kueue=True)[1]}
    assert queued == {*FAULTS, *KUEUE_FAULTS}
    assert not {f for index in range(200) for f in drawn(1, index)[1]} & set(KUEUE_FAULTS)
    body = chaos_job("j", "c", 5, kueue=True)
    assert body["metadata"]["labels"] == {"kueue.x-k8s.io/queue-name": "user-queue",
                                          "kueue.x-k8s.io/priority-class": "low-priority"}  # fmt: skip
    assert body["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] == {"example.com/slot": "1"}
    assert chaos_job("j", "c", 5)["metadata"]["labels"] == {}


def test_with_two_replicas_the_draw_adds_the_leaders_kill_and_cut_and_one_replica_draws_as_before() -> None:
    from bench.chaos.faults import HA_FAULTS

    paired = {f for index in range(200) for f in drawn(1, index, replicas=2)[1]}
    assert paired == {*FAULTS, *HA_FAULTS}
    assert [drawn(1, index)[1] for index in range(50)] == [drawn(1, index, replicas=1)[1] for index in range(50)]
    assert not {f for index in range(200) for f in drawn(1, index)[1]} & set(HA_FAULTS)


def test_a_topology_run_requires_one_rack_of_its_queue_whose_flavor_is_the_boxs_topology_flavor() -> None:
    from bench.chaos.job import chaos_job, kueue_queues

    racked = chaos_job("j", "c", 5, kueue=True, rack="topology.ddpjob.dev/rack")
    annotations = racked["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {"kueue.x-k8s.io/podset-required-topology": "topology.ddpjob.dev/rack"}
    assert chaos_job("j", "c", 5, kueue=True)["spec"]["template"]["metadata"]["annotations"] == {}
    (cq,) = [body for plural, body in kueue_queues("ns", "box-topology") if plural == "clusterqueues"]
    assert [f["name"] for f in cq["spec"]["resourceGroups"][0]["flavors"]] == ["box-topology"]
    away = chaos_job("j", "c", 5, kueue=True, avoid="box-node")["spec"]["template"]["spec"]["affinity"]
    (term,) = away["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["box-node"]}]


def test_a_violation_keeps_every_line_of_its_job_and_none_of_a_job_whose_name_it_begins() -> None:
    lines = [f"chaos/chaos-1-24: line {i}" for i in range(3)] + ["chaos/chaos-1-2: other", "pod chaos-1-24-0 gone"]
    filler = "x" * 5000
    kept = log_excerpt("\n".join([lines[0], filler, *lines[1:], filler]), "chaos-1-24", tail=100)
    head, tail = kept.split("\n--- the log's tail ---\n")
    assert head.splitlines() == ["chaos/chaos-1-24: line 0", "chaos/chaos-1-24: line 1", "chaos/chaos-1-24: line 2",
                                 "pod chaos-1-24-0 gone"]  # fmt: skip
    assert tail == ("\n" + filler)[-100:]


def test_a_restarting_fault_counts_as_too_late_only_when_the_jobs_success_explains_it() -> None:
    def ended(reason: str) -> dict[str, object]:
        return {"phase": "Succeeded", "conditions": [{"type": "Succeeded", "reason": reason, "message": "m"}]}

    assert too_late("delete-pod", ended("AllRanksSucceeded"))
    assert too_late("hang-rank", ended("RanksStuckExiting"))
    assert not too_late("hang-rank", ended("AllRanksSucceeded")), "a stopped rank cannot exit 0"
    assert not too_late("kill-rank", ended("RanksStuckExiting")), "a killed rank fails: that restarts"
    assert not too_late("delete-pod", ended("RanksStuckExiting")), "a deleted rank fails: that restarts"


def test_children_get_their_time_from_the_end_of_a_box_fault_that_came_during_the_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Soak 7, run 1:0: the apiserver restarted twice while the deleted job's children were waited for;
    the garbage collector's time down is not the job's."""
    monkeypatch.setattr(invariants, "RELIST_BACKOFF_SECONDS", 0.0)
    stack: Any = SimpleNamespace(nodes_whole_since=0.0, whole_since=time.monotonic() - 10)
    started, calls = time.monotonic(), []

    def gone() -> bool:
        calls.append(1)
        if len(calls) == 1:
            stack.whole_since = time.monotonic() + 0.8  # a restart that ends 0.8 s into the wait
        return time.monotonic() - started > 1.0  # gone 1 s in: past the 0.5 s, within 0.5 s of the fault's end

    assert wait_while_whole(stack, "the children to go", gone, 0.5)
    assert len(calls) > 1


def test_children_get_the_informers_relist_backoff_after_a_box_fault(monkeypatch: pytest.MonkeyPatch) -> None:
    """Soak 10, run 1:93: after three apiserver restarts in 42 s the garbage collector deleted the children
    about 60 s after the apiserver was back; client-go's informers may wait that long before they list."""
    monkeypatch.setattr(invariants, "RELIST_BACKOFF_SECONDS", 0.8)
    stack: Any = SimpleNamespace(nodes_whole_since=0.0, whole_since=time.monotonic())  # a fault that has just ended
    started = time.monotonic()
    assert wait_while_whole(stack, "the children to go", lambda: time.monotonic() - started > 1.0, 0.5)

    stack.whole_since = time.monotonic() - 10  # long ago: the backoff has reset, 0.5 s is all
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="waiting for the children to go"):
        wait_while_whole(stack, "the children to go", lambda: time.monotonic() - started > 1.0, 0.5)


def test_children_that_never_go_fail_the_run_even_while_faults_keep_coming(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(invariants, "GONE_CAP_SECONDS", 1.0)
    stack: Any = SimpleNamespace(nodes_whole_since=0.0, whole_since=time.monotonic())

    def never() -> bool:
        stack.whole_since = time.monotonic()  # another run's fault, again and again
        return False

    with pytest.raises(TimeoutError, match="waiting for the children to go"):
        wait_while_whole(stack, "the children to go", never, 0.5)


def test_a_child_left_behind_is_named_with_what_holds_it() -> None:
    assert held("Pod", "j-0", None, None) == "Pod j-0"
    finalizer = "scheduling.k8s.io/podgroup-protection"
    assert (
        held("PodGroup", "j-attempt-0", "2026-11-25T14:50:15Z", [finalizer])
        == f"PodGroup j-attempt-0 (deleting since 2026-11-25T14:50:15Z) (finalizers {finalizer})"
    )


def test_a_restart_for_a_container_that_never_ran_is_charged_to_the_kubelet_restart_that_caused_it() -> None:
    started = (
        "RetryableFailure: rank 0 (pod chaos-1-148-0) init container ddpjob-wait-for-master exited with code 128"
        " (StartError: failed to start containerd task: context canceled); restarting the gang as attempt 1"
    )
    plain = "RetryableFailure: rank 1 (pod chaos-1-3-1) exited with code 137: killed; restarting the gang as attempt 1"
    assert never_started([started, "AllRanksRunning: all 2 ranks are running (attempt 1)"]) == 1
    assert never_started([plain]) == 0


def test_an_interrupted_soak_stops_its_runs_waits_at_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Seen twice: after SIGTERM the soak waited minutes for the runs under way, each in a wait with a long deadline.
    def blocked(stack: object, seed: int, index: int, overlaps: object) -> Run:
        deadline = time.monotonic() + 10  # past the 5 s asserted below, so a soak that waits fails, not hangs
        wait_until("a job that never ends", lambda: False, lambda: deadline)
        raise AssertionError("unreachable")

    def interrupted(futures: object) -> Iterator[object]:
        time.sleep(0.3)
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "guarded_run", blocked)
    monkeypatch.setattr(runner, "as_completed", interrupted)
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            runner.soak(cast(Any, None), 1, [0, 1], tmp_path / "runs.jsonl", parallel=2)
    finally:
        STOPPING.clear()
    assert time.monotonic() - started < 5


def test_a_job_with_no_restart_to_spare_must_fail_with_backoff_limit_exceeded() -> None:
    def ended(outcome: str, reason: str, restarts: int, faults: list[str], limit: int, **more: Any) -> list[str]:
        return outcome_as_promised(
            Run(
                1, 7, faults, outcome=outcome, reason=reason, restarts=restarts, step=STEPS, backoff_limit=limit, **more
            )
        )

    assert ended("Failed", "BackoffLimitExceeded", 0, ["kill-rank"], 0) == []
    assert ended("Failed", "BackoffLimitExceeded", 0, ["hang-rank", "restart-etcd"], 0) == []
    assert ended("Succeeded", "AllRanksSucceeded", 0, ["restart-etcd"], 0) == []
    assert ended("Succeeded", "AllRanksSucceeded", 1, ["kill-rank"], 5) == []
    assert ended("Succeeded", "AllRanksSucceeded", 0, ["kill-rank"], 0, skipped=["kill-rank"]) == [], "too late"
    [restarted] = ended("Succeeded", "AllRanksSucceeded", 1, ["kill-rank"], 0)
    assert "expected Failed (BackoffLimitExceeded)" in restarted and "backoffLimit 0" in restarted
    [other] = ended("Failed", "NonRetryableFailure", 0, ["kill-rank"], 0)
    assert "Failed (NonRetryableFailure), expected Failed (BackoffLimitExceeded)" in other
    [failed] = ended("Failed", "BackoffLimitExceeded", 1, ["kill-rank"], 5)
    assert "the job failed (BackoffLimitExceeded)" in failed
    assert ended("job deleted", "", -1, ["kill-rank", "delete-job"], 0) == []
    starts = ["RetryableFailure: init container exited with code 128 (StartError: failed to start ...)"]
    assert ended("Failed", "BackoffLimitExceeded", 0, ["restart-kubelet"], 0, events=starts) == [], "a kubelet restart"


def test_every_eighth_run_has_no_restart_to_spare() -> None:
    limits = [backoff_limit(index) for index in range(16)]
    assert limits == [5] * 7 + [0] + [5] * 7 + [0]


def test_a_trainer_container_that_never_ran_is_charged_to_the_kubelet_restart_that_caused_it() -> None:
    """Chaos --kueue run 1:19: the trainer container itself (not the init container) failed to start as another
    run's kubelet restart landed (exit 128, StartError): the operator's message says so, and the soak counts it."""
    from bench.chaos.invariants import never_started
    from ddpjob_operator.status import Failure

    failure = Failure(rank=0, pod="j-0", exit_code=128, exit_reason="StartError",
                      message='failed to start containerd task "9e": context canceled: unknown')  # fmt: skip
    event = f"RetryableFailure: {failure.describe()}; restarting the gang as attempt 2 (restart 2 of 5)"
    assert never_started([event]) == 1
    assert never_started(["RetryableFailure: rank 0 (pod j-0) exited with code 137"]) == 0


def test_with_several_nodes_the_draw_adds_node_cuts_and_leaves_the_other_draws_alone() -> None:
    from bench.chaos.faults import NODE_FAULTS

    assert {f for index in range(200) for f in drawn(1, index, nodes=3)[1]} == {*FAULTS, *NODE_FAULTS}
    assert [drawn(5, i)[1] for i in range(20)] == [drawn(5, i, nodes=1)[1] for i in range(20)], "replays draw the same"


def test_a_node_cut_costs_its_run_one_restart_and_another_runs_cut_under_it_may_cost_one_more() -> None:
    def ended(restarts: int, faults: list[str], hits: int = 0, limit: int = 5, outcome: str = "Succeeded") -> list[str]:
        reason = "BackoffLimitExceeded" if outcome == "Failed" else "AllRanksSucceeded"
        run = Run(1, 3, faults, outcome=outcome, reason=reason, restarts=restarts, step=STEPS, backoff_limit=limit)
        run.node_hits = hits
        return outcome_as_promised(run)

    assert ended(1, ["power-cut"]) == [] and ended(2, ["network-cut", "kill-rank"]) == []
    [none] = ended(0, ["power-cut"])
    assert "restarts 0, expected 1" in none
    assert ended(0, ["restart-etcd"], hits=1) == [] and ended(1, ["restart-etcd"], hits=1) == []
    [too_many] = ended(3, ["kill-rank"], hits=1)
    assert "restarts 3, expected 1-2" in too_many and "1 other runs' node cuts under it" in too_many
    assert ended(0, ["restart-etcd"], hits=1, limit=0, outcome="Failed") == [], "no restart to spare for the hit"


def test_children_on_a_cut_node_get_their_time_from_when_it_is_back() -> None:
    """A pod deleted on a cut node goes once its kubelet is back (chaos 1:6, 1:9, 1:10 of 2026-11-29)."""
    stack: Any = SimpleNamespace(nodes_whole_since=math.inf, whole_since=time.monotonic() - 100)
    back = time.monotonic() + 1.0

    def gone() -> bool:
        if stack.nodes_whole_since == math.inf and time.monotonic() > back:
            stack.nodes_whole_since = time.monotonic()  # the node back 1 s into a 0.3 s wait
        return stack.nodes_whole_since != math.inf and time.monotonic() > stack.nodes_whole_since + 0.1

    assert wait_while_whole(stack, "the children to go", gone, 0.3)
    stack.nodes_whole_since = time.monotonic() - 100  # back long ago: 0.3 s is all
    with pytest.raises(TimeoutError):
        wait_while_whole(stack, "the children to go", lambda: False, 0.3)


def test_a_node_lost_that_no_run_cut_may_cost_one_restart_more_and_no_other() -> None:
    """Chaos 1:22 and 1:24 of 2026-11-29: a node went Unknown with no cut (a kubelet restart past the 10 s grace
    period), and the job restarted once more for it, NodeLost."""
    lost = "NodeLost: node box-node-2 is lost (Unknown since 2026-11-29T03:52:46Z): restarting the gang as attempt 2"
    hung = "NoProgress: no rank advanced its step for 20s; restarting the gang as attempt 1 (restart 1 of 5)"

    def run(restarts: int, events: list[str], node_hits: int = 0) -> Run:
        return Run(1, 22, ["hang-rank"], outcome="Succeeded", restarts=restarts, step=STEPS, events=events,
                   node_hits=node_hits)  # fmt: skip

    assert outcome_as_promised(run(2, [hung, lost])) == []
    assert outcome_as_promised(run(1, [hung, lost])) == []
    assert outcome_as_promised(run(2, [hung])) != [], "without a lost node, the second restart is one too many"
    assert outcome_as_promised(run(3, [hung, lost])) != []
    assert outcome_as_promised(run(2, [hung, lost, lost])) == [], "one node lost once is one restart, said twice"
    # Chaos 1:5 of the second 40-run soak: one other run's cut counted (node_hits), and two nodes lost, the second
    # found after its peers' failure had restarted the gang already ("already counted").
    first = "NodeLost: node box-node is lost (Unknown since 2026-11-29T04:36:23Z): restarting the gang as attempt 1"
    second = "NodeLost: node box-node-2 is lost (Unknown since 2026-11-29T04:37:14Z): the restart came from it"
    assert outcome_as_promised(run(3, [hung, first, second], node_hits=1)) == []
    assert outcome_as_promised(run(4, [hung, first, second], node_hits=1)) != []
