"""``node.id``: a node named by its operator. Ids compare as strings and the lowest reduces in
the synchronous mode, so an operator puts the reducer on the best-linked machine by naming it;
the id is checked like one a membership message carries, a state dir holding another id gives
way to it, and two nodes given one id are told so (real daemons with stub workers)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from daemon_util import metrics_text, sample_value
from nodes import STUB, wait_for
from p2pnode.config import Config, ConfigError
from p2pnode.daemon import identity


def stored(state_dir: Path) -> dict:
    return json.loads((state_dir / identity.IDENTITY_FILE).read_text())


def test_a_named_node_keeps_its_name_and_counts_its_lives(tmp_path: Path) -> None:
    first = identity.load_or_create(tmp_path, "0-gateway")
    assert (first.node_id, first.incarnation) == ("0-gateway", 0)
    again = identity.load_or_create(tmp_path, "0-gateway")
    assert (again.node_id, again.incarnation) == ("0-gateway", 1)
    assert stored(tmp_path) == {"node_id": "0-gateway", "incarnation": 1}
    unnamed = identity.load_or_create(tmp_path)  # node.id emptied again: the id stays what it was
    assert (unnamed.node_id, unnamed.incarnation) == ("0-gateway", 2)


def test_a_state_dir_of_another_id_gives_way_to_the_name(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    drawn = identity.load_or_create(tmp_path)
    identity.load_or_create(tmp_path)  # a second life: incarnation 1
    assert len(drawn.node_id) == 16 and stored(tmp_path)["incarnation"] == 1
    with caplog.at_level(logging.WARNING, "p2pnode.node"):
        named = identity.load_or_create(tmp_path, "0-gateway")
    assert (named.node_id, named.incarnation) == ("0-gateway", 0)  # a new member: its own first life
    assert stored(tmp_path) == {"node_id": "0-gateway", "incarnation": 0}
    assert drawn.node_id in caplog.text and "0-gateway" in caplog.text and "new member" in caplog.text


@pytest.mark.parametrize("bad", [" 0-gateway", "0-gateway ", "a" * 129, "tab\there", "line\nbreak"])
def test_an_id_no_membership_message_could_carry_is_refused_by_name(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"^node\.id: "):
        Config.from_dict({"node": {"id": bad}})


def test_ids_that_membership_carries_are_taken() -> None:
    for good in ("0-gateway", "a" * 128, "rack 4/node 7", "nœud-é"):
        assert Config.from_dict({"node": {"id": good}}).node.id == good


def conflicts(node) -> float:
    return sample_value(metrics_text(node.addr), "p2pnode_membership_id_conflicts_total")


@pytest.mark.timeout(120)
def test_a_named_node_is_known_by_its_name_and_a_twin_is_told(cluster) -> None:
    a = cluster("a", extra=[*STUB, "--set", "node.id=0-gateway"])
    assert a.wait_ready()["node_id"] == "0-gateway"
    b = cluster("b", seeds=[a.addr], extra=STUB)
    b.wait_ready()
    wait_for(lambda: any(m["node_id"] == "0-gateway" and m["state"] == "alive" and m["addr"] == a.addr
                         for m in b.status()["members"]), 30, "b to know a by its name")
    assert conflicts(a) == 0 and conflicts(b) == 0
    # a second node given the same id: it hears of the first at another address, and says so
    twin = cluster("twin", seeds=[a.addr], extra=[*STUB, "--set", "node.id=0-gateway"])
    wait_for(lambda: "node ids must be unique" in twin.log(), 30, "the twin to report the clash")
    assert twin.status()["node_id"] == "0-gateway"
    assert conflicts(twin) >= 1
