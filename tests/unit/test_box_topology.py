"""The box's node topology (``ddpjob cluster up --topology``): parsing, each node's labels and Kueue's Topology."""

from __future__ import annotations

import pytest

from ddpjob_box.errors import BoxError
from ddpjob_box.topology import HOSTNAME_LABEL, Level, node_labels, parse, topology_object

RACK = "topology.ddpjob.dev/rack"
BLOCK = "topology.ddpjob.dev/block"


def test_levels_are_read_outermost_first() -> None:
    assert parse("block=2, rack=2") == (Level("block", 2), Level("rack", 2))
    assert parse("") == ()


@pytest.mark.parametrize("text", ["rack", "rack=0", "rack=two", "=2", "rack=2,rack=2", "a-b=2"])
def test_a_malformed_topology_names_the_flag_and_the_part(text: str) -> None:
    with pytest.raises(BoxError, match="--topology"):
        parse(text)


def test_four_nodes_in_two_racks_two_per_rack_in_order() -> None:
    labels = node_labels(parse("rack=2"), 4)
    assert [lb[RACK] for lb in labels] == ["rack-0", "rack-0", "rack-1", "rack-1"]


def test_two_blocks_of_two_racks_number_the_racks_across_the_box() -> None:
    labels = node_labels(parse("block=2,rack=2"), 4)
    assert [(lb[BLOCK], lb[RACK]) for lb in labels] == [
        ("block-0", "rack-0"),
        ("block-0", "rack-1"),
        ("block-1", "rack-2"),
        ("block-1", "rack-3"),
    ]
    eight = node_labels(parse("block=2,rack=2"), 8)
    assert [lb[RACK] for lb in eight] == [
        "rack-0",
        "rack-0",
        "rack-1",
        "rack-1",
        "rack-2",
        "rack-2",
        "rack-3",
        "rack-3",
    ]
    assert [lb[BLOCK] for lb in eight] == ["block-0"] * 4 + ["block-1"] * 4


def test_nodes_that_do_not_fill_the_domains_evenly_are_refused_with_the_count_to_give() -> None:
    with pytest.raises(BoxError, match="multiple of 4"):
        node_labels(parse("block=2,rack=2"), 6)


def test_no_topology_labels_nothing() -> None:
    assert node_labels((), 3) == [{}, {}, {}]


def test_the_topology_lists_each_level_then_the_hostname() -> None:
    levels = [lv["nodeLabel"] for lv in topology_object(parse("block=2,rack=2"))["spec"]["levels"]]
    assert levels == [BLOCK, RACK, HOSTNAME_LABEL]
