"""Training progress against the real apiserver: the operator polls fake trainers (real HTTP on
per-pod loopback IPs serving the trainer's own metrics registry) and writes what it sees."""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import Operator
from .helpers import HANG, Raw, trainer_metrics, training, wait_for
from .test_lifecycle import condition, start

pytestmark = pytest.mark.cluster


def running_condition(raw: Raw, ns: str, name: str) -> Any:
    return lambda: next((c for c in raw.status(ns, name).get("conditions", []) if c["type"] == "Running"), None)


def test_the_job_shows_rendezvous_and_how_many_ranks_joined_until_every_rank_is_ready(
    raw: Raw, namespace: str, operator: Operator
) -> None:
    start(raw, namespace)
    raw.set_all(namespace, "train", "Running", trainer=trainer_metrics(joined=False))

    def message(text: str) -> Any:
        return lambda: (c := running_condition(raw, namespace, "train")()) and c["message"] == text and c

    found = wait_for(message("0 of 2 ranks joined the process group"), what="rendezvous, nobody joined")
    assert found["reason"] == "Rendezvous" and raw.status(namespace, "train")["phase"] == "Rendezvous"
    raw.set_pod(namespace, "train-0", "Running")
    wait_for(message("1 of 2 ranks joined the process group"), what="rank 0 joined")
    assert raw.status(namespace, "train")["ready"] == "2/2", "both pods run: READY counts pods"
    raw.set_pod(namespace, "train-1", "Running")
    wait_for(lambda: raw.status(namespace, "train").get("phase") == "Running", what="Running")
    assert condition(raw.status(namespace, "train"), "Running")["reason"] == "AllRanksRunning"


def reasons(raw: Raw, namespace: str) -> list[str]:
    """The reasons of the job's Events: they are posted off the reconcile, so tests wait for them."""
    return [e["reason"] for e in raw.events(namespace, "train")]


def test_a_silent_rank_is_shown_in_status_and_no_progress_restarts_the_gang(
    raw: Raw, namespace: str, operator: Operator
) -> None:
    start(raw, namespace, progressDeadlineSeconds=6)
    raw.set_all(namespace, "train", "Running", trainer=training())
    # Running: a poll saw both ranks joined. A step alone may be rank 0's, and a rank 1 silenced before any poll saw
    # it join leaves the job in Rendezvous, where the progress deadline does not apply (a loop run failed so).
    wait_for(
        lambda: (s := raw.status(namespace, "train")).get("phase") == "Running" and s["progress"]["step"] > 0,
        what="Running, with steps",
        seen=lambda: raw.status(namespace, "train"),
    )
    raw.set_pod(namespace, "train-0", "Running", trainer=trainer_metrics(steps=10**3))  # waits for rank 1...
    raw.set_pod(namespace, "train-1", "Running", trainer=HANG)  # ...which answers no more

    def silent() -> Any:
        ranks = raw.status(namespace, "train").get("progress", {}).get("ranks", [])
        return len(ranks) == 2 and ranks[1].get("error") and ranks

    ranks = wait_for(silent, what="rank 1 shown as not answering")
    assert ranks[1]["error"] == "no answer within 2s" and ranks[0]["step"] == 1000
    status = wait_for(
        lambda: (s := raw.status(namespace, "train")).get("restarts") == 1 and s,
        what="a restart",
        seen=lambda: raw.status(namespace, "train"),
    )
    restarting = condition(status, "Restarting")
    assert restarting["reason"] == "NoProgress"
    assert "no rank advanced its step for 6s (spec.progressDeadlineSeconds=6)" in restarting["message"]
    assert "not answering: rank 1 (pod train-1 on node unknown: " in restarting["message"]
    wait_for(lambda: "NoProgress" in reasons(raw, namespace), what="the NoProgress event (posted off the reconcile)")


def test_a_slow_rank_is_flagged_with_an_event_and_cleared_when_it_recovers(
    raw: Raw, namespace: str, operator: Operator
) -> None:
    start(raw, namespace, straggler={"factor": 3, "windowSeconds": 3})
    raw.set_pod(namespace, "train-0", "Running", trainer=training())
    raw.set_pod(namespace, "train-1", "Running", trainer=training(work=0.3))

    def straggler(state: str) -> Any:
        def check() -> Any:
            found = [c for c in raw.status(namespace, "train").get("conditions", [])
                     if c["type"] == "StragglerDetected" and c["status"] == state]  # fmt: skip
            return found and found[0]

        return check

    flagged = wait_for(straggler("True"), what="StragglerDetected")
    assert flagged["message"].startswith("rank 1 (pod train-1 on node unknown) works 0.3s per step, 30.0x the median")
    wait_for(lambda: "StragglerDetected" in reasons(raw, namespace), what="the StragglerDetected event")
    (event,) = [e for e in raw.events(namespace, "train") if e["reason"] == "StragglerDetected"]
    assert event["type"] == "Warning" and "pod train-1" in event["message"]
    assert raw.status(namespace, "train")["progress"]["slowestRank"] == 1
    raw.set_pod(namespace, "train-1", "Running", trainer=training())
    cleared = wait_for(straggler("False"), what="StragglerDetected cleared")
    assert cleared["reason"] == "StragglerRecovered"
    wait_for(lambda: "StragglerRecovered" in reasons(raw, namespace), what="the StragglerRecovered event")
