"""A finished job's status.progress holds its outcome, not its last poll (issue 31).

Each case runs a job through the fake cluster of ``test_lifecycle`` to its end: some ranks answer the polls,
the others' polls are refused (a program that serves no metrics, or one already gone), then every pod exits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

import pytest

from ddpjob_contract.status import Phase
from ddpjob_operator.progress import REFUSED, RankSample

from .factories import job
from .test_lifecycle import FakeCluster, summary


@dataclass(frozen=True, kw_only=True)
class Case:
    replicas: int = 2
    nproc: int = 1
    answer: tuple[int, ...] = ()
    """Global ranks that answer the polls; the others' polls are refused."""
    polls: int = 3
    """Polls, two seconds apart, before the pods exit (too few to call a rank silent while it runs)."""
    exit_code: int = 0
    messages: dict[int, str] = field(default_factory=dict)
    """Each pod's termination message (our trainer's exit summary); none for the textbook script."""
    phase: Phase = Phase.SUCCEEDED
    joined: int = 2
    silent: tuple[int, ...] = ()
    note: str = ""
    final: bool = False


def run_to_the_end(case: Case) -> FakeCluster:
    c = FakeCluster(job(replicas=case.replicas, nprocPerNode=case.nproc))
    c.settle()
    c.set_all(phase="Running")
    c.settle()
    world = case.replicas * case.nproc
    c.gone = [r for r in range(world) if r not in case.answer]
    for r in case.answer:
        c.metrics[r] = RankSample(ready=True, step=500.0, steps=500.0)
    for _ in range(case.polls):
        c.now += timedelta(seconds=2)
        c.poll()
    if case.polls and c.gone:  # what the status carried before this change, and still does while it runs
        assert c.status.progress is not None
        assert [r.error for r in c.status.progress.ranks if r.rank in c.gone] == [REFUSED] * len(c.gone)
    for rank in range(case.replicas):
        c.set(rank, phase="Succeeded" if case.exit_code == 0 else "Failed", exit_code=case.exit_code,
              message=case.messages.get(rank, ""))  # fmt: skip
    c.settle()
    return c


TEXTBOOK_NOTE = "rank 0 serves no metrics on port 9090, rank 1 serves no metrics on port 9090: progress is not " \
    "shown for them"  # fmt: skip

CASES = {
    "a textbook script whose polls were refused: no rank error, one note, every rank joined": Case(
        silent=(0, 1), note=TEXTBOOK_NOTE
    ),
    "a textbook script that ended before its first poll: the same one note": Case(
        polls=0, silent=(0, 1), note=TEXTBOOK_NOTE
    ),
    "a job where one rank served metrics: the note names only the other": Case(
        answer=(0,), silent=(1,), note="rank 1 serves no metrics on port 9090: progress is not shown for it"
    ),
    "our trainer: its exit summaries give the final figures, and no note": Case(
        answer=(0, 1), messages={0: summary(500, 870.0, 0.0184), 1: summary(500, 860.0, 0.0186)}, final=True
    ),
    "our trainer, two processes a pod, gone before the polls: a pod's summary speaks for both": Case(
        nproc=2, polls=2, messages={0: summary(500, 870.0, 0.0184), 1: summary(500, 860.0, 0.0186)},
        joined=4, final=True,
    ),
    "a failed job: no rank error either, and joined stays as the polls saw it": Case(
        exit_code=1, answer=(0,), phase=Phase.FAILED, joined=1
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_finished_job_s_progress_holds_its_outcome_not_its_last_poll(case: Case) -> None:
    c = run_to_the_end(case)
    p = c.status.progress
    assert c.status.phase is case.phase and p is not None
    assert [r.error for r in p.ranks if r.error] == [], "no poll error in a finished job's status"
    assert all("error" not in r for r in p.to_dict().get("ranks", []))
    assert (p.joined, p.silent, p.note, p.final) == (case.joined, case.silent, case.note, case.final)
    again = c.step()
    assert again.status == c.status, "the finished status is written once, then stays"


def test_the_textbook_script_s_final_status_reads_as_its_outcome() -> None:
    c = run_to_the_end(Case(silent=(0, 1), note=TEXTBOOK_NOTE))
    assert c.status.progress is not None
    assert c.status.progress.to_dict() == {
        "attempt": 0,
        "joined": 2,
        "worldSize": 2,
        "observedTime": c.status.progress.to_dict()["observedTime"],
        "silentRanks": [0, 1],
        "note": TEXTBOOK_NOTE,
    }
