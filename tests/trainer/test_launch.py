"""The torchrun environment convention, and the single-process default when nothing is set."""

from __future__ import annotations

import pytest

from ddp_trainer.errors import ConfigError
from ddp_trainer.launch import Launch, read_launch

TORCHRUN = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}


def test_nothing_set_means_one_process_without_a_process_group() -> None:
    launch = read_launch({})
    assert launch == Launch() and not launch.distributed


def test_the_launcher_variables_are_read_as_they_are_set() -> None:
    launch = read_launch(TORCHRUN)
    assert (launch.rank, launch.world_size, launch.local_rank) == (3, 4, 1)
    assert (launch.master_addr, launch.master_port) == ("10.0.0.1", 29500)
    assert launch.distributed


def test_a_process_restarted_in_place_by_an_agent_knows_its_restart_count_and_supervises_nothing() -> None:
    launch = read_launch({**TORCHRUN, "TORCHELASTIC_RESTART_COUNT": "2"})
    assert launch.restart_count == 2 and launch.under_agent
    assert not read_launch(TORCHRUN).under_agent and read_launch(TORCHRUN).restart_count == 0


def test_local_rank_defaults_to_zero_for_launchers_that_leave_it_out() -> None:
    env = {k: v for k, v in TORCHRUN.items() if k != "LOCAL_RANK"}
    assert read_launch(env).local_rank == 0


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"MASTER_ADDR": ""}, "WORLD_SIZE is set but MASTER_ADDR is not"),
        ({"MASTER_PORT": ""}, "MASTER_PORT"),
        ({"RANK": ""}, "RANK"),
        ({"RANK": "4"}, "RANK=4 is outside 0..3"),
        ({"WORLD_SIZE": "two"}, "WORLD_SIZE='two' is not an integer"),
        ({"WORLD_SIZE": "0"}, "WORLD_SIZE=0"),
        ({"MASTER_PORT": "70000"}, "MASTER_PORT=70000"),
    ],
)
def test_an_incomplete_or_bad_launch_environment_is_a_config_error(change: dict[str, str], expected: str) -> None:
    env = {k: v for k, v in {**TORCHRUN, **change}.items() if v}
    with pytest.raises(ConfigError, match=expected):
        read_launch(env)
