"""The stop vote's agreement and pace, with the gang's all-reduce played by a table shared by the ranks' voters.

The real collective under real signals is in tests/trainer/test_program.py; here, every schedule of steps and
requests can be tried."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from ddp_trainer.stop_vote import MAX_EVERY, PACE_SECONDS, StopVote, every_for


@dataclass
class Table:
    """The n-th vote of every rank, reduced by maximum once each rank has cast it."""

    ranks: int
    votes: list[list[list[int]]] = field(default_factory=list)

    def cast(self, rank: int, number: int, values: list[int]) -> None:
        while len(self.votes) <= number:
            self.votes.append([])
        self.votes[number].append(values)

    def answer(self, number: int) -> list[int]:
        cast = self.votes[number]
        assert len(cast) == self.ranks, f"vote {number} read before every rank cast it: the ranks disagree"
        return [max(column) for column in zip(*cast, strict=True)]


@dataclass
class Answer:
    table: Table
    number: int

    def result(self) -> list[int]:
        return self.table.answer(self.number)


@dataclass
class Rank:
    table: Table
    rank: int
    world_size: int
    cast: int = 0

    def max_async(self, values: list[int]) -> Answer:
        self.table.cast(self.rank, self.cast, values)
        self.cast += 1
        return Answer(self.table, self.cast - 1)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run(step_seconds: list[float], asked: dict[int, int], steps: int) -> tuple[list[int | None], list[Rank]]:
    """Drives every rank through ``steps`` steps in lockstep; ``asked`` maps a rank to the step after which it is
    signalled. Returns the step each rank stopped at (None: it ran to the end) and the ranks."""
    table = Table(len(step_seconds))
    ranks = [Rank(table, r, len(step_seconds)) for r in range(len(step_seconds))]
    clocks = [Clock() for _ in ranks]
    voters = [StopVote(rank, clock) for rank, clock in zip(ranks, clocks, strict=True)]
    stopped: list[int | None] = [None] * len(ranks)
    for step in range(1, steps + 1):
        for r, voter in enumerate(voters):
            if stopped[r] is not None:
                continue
            clocks[r].now += step_seconds[r]
            if voter.after_step(step, asked.get(r, steps + 1) <= step):
                stopped[r] = step
    for voter in voters:
        voter.close()
    return stopped, ranks


@pytest.mark.parametrize("step_seconds", [0.001, 0.02, 0.5, 3.0])
@pytest.mark.parametrize("signalled_at", [1, 2, 7, 60])
def test_a_request_to_one_rank_stops_every_rank_at_the_same_step_soon_after(step_seconds: float, signalled_at: int):
    stopped, _ = run([step_seconds, step_seconds], {1: signalled_at}, steps=400)
    assert stopped[0] == stopped[1] is not None
    assert stopped[0] >= signalled_at
    # A vote starts at least every PACE_SECONDS (or MAX_EVERY steps), and is read one step later.
    assert stopped[0] - signalled_at <= min(every_for(int(step_seconds * 1e6)), MAX_EVERY) + 1


def test_without_a_request_no_rank_stops_and_no_vote_is_left_unread():
    stopped, ranks = run([0.01, 0.01, 0.01], {}, steps=300)
    assert stopped == [None, None, None]
    assert len({rank.cast for rank in ranks}) == 1


def test_votes_are_paced_by_the_slowest_rank_so_fast_steps_pay_for_few_of_them():
    _, fast = run([0.001, 0.001], {}, steps=1000)
    _, slow = run([0.001, 0.3], {}, steps=100)
    assert fast[0].cast <= 1000 // MAX_EVERY + 5
    assert slow[0].cast >= 90  # one rank's 0.3 s steps set the pace for both: a vote every step


def test_the_pace_keeps_a_vote_about_every_pace_seconds():
    assert every_for(int(PACE_SECONDS * 1e6)) == 1
    assert every_for(10_000) == 25
    assert every_for(1) == MAX_EVERY
    assert every_for(0) == 1


def test_alone_a_request_stops_at_once_without_a_collective():
    table = Table(1)
    rank = Rank(table, 0, 1)
    vote = StopVote(rank)
    assert not vote.after_step(1, False)
    assert vote.after_step(2, True)
    assert rank.cast == 0
