"""Peer selection for exchanges: random, ring, one-peer exponential graph."""

from __future__ import annotations

import random

import pytest

from p2pnode.membership.base import Member
from p2pnode.membership.selection import PeerSelector, choose_peer, exponential_offset


def ids(n: int) -> list[str]:
    return [f"node-{i:03d}" for i in range(n)]


def gossip_average(n: int, rounds: int, strategy: str, seed: int = 0) -> list[float]:
    """Every node pulls its chosen peer's value and averages with it, all at once."""
    rng = random.Random(seed)
    names = ids(n)
    x = {name: float(i * i % 7 + i) for i, name in enumerate(names)}
    for r in range(rounds):
        chosen = {me: choose_peer(strategy, names, me, r, rng) for me in names}
        x = {me: (x[me] + x[chosen[me]]) / 2 for me in names}
    return [x[name] for name in names]


@pytest.mark.parametrize("n", [2, 4, 8, 16, 32, 64])
def test_exponential_graph_averages_exactly_in_log2_n_rounds(n: int) -> None:
    start = [float(i * i % 7 + i) for i in range(n)]
    mean = sum(start) / n
    rounds = n.bit_length() - 1
    assert gossip_average(n, rounds, "exponential") == pytest.approx([mean] * n, abs=1e-12)
    if n > 2:  # one round fewer is not enough
        assert gossip_average(n, rounds - 1, "exponential") != pytest.approx([mean] * n, abs=1e-9)


def test_exponential_offsets_cycle_through_powers_of_two() -> None:
    assert [exponential_offset(r, 16) for r in range(9)] == [1, 2, 4, 8, 1, 2, 4, 8, 1]
    assert [exponential_offset(r, 12) for r in range(5)] == [1, 2, 4, 8, 1]  # ceil(log2 12) = 4
    names = ids(8)
    assert [choose_peer("exponential", names, "node-006", r, random.Random()) for r in range(3)] == [
        "node-007", "node-000", "node-002"]


def test_exponential_on_other_sizes_still_converges() -> None:
    start = gossip_average(12, 0, "exponential")
    values = gossip_average(12, 40, "exponential")
    assert max(values) - min(values) < 1e-5 * (max(start) - min(start))
    assert sum(values) == pytest.approx(sum(start))  # doubly stochastic: the mean is kept


def test_ring_is_the_successor_in_id_order() -> None:
    names = ids(5)
    assert [choose_peer("ring", names, n, 0, random.Random()) for n in names] == names[1:] + names[:1]
    # the list may omit ourselves: we are placed by our id
    assert choose_peer("ring", ["b", "d"], "c", 3, random.Random()) == "d"
    assert choose_peer("ring", ["b", "d"], "e", 3, random.Random()) == "b"


def test_random_is_uniform_and_never_self() -> None:
    rng = random.Random(3)
    names = ids(5)
    picks = [choose_peer("random", names, "node-002", r, rng) for r in range(4000)]
    assert "node-002" not in picks
    for other in set(names) - {"node-002"}:
        assert 850 < picks.count(other) < 1150


def test_alone_and_bad_strategy() -> None:
    assert choose_peer("exponential", [], "me", 0, random.Random()) is None
    assert choose_peer("ring", ["me"], "me", 0, random.Random()) is None
    with pytest.raises(ValueError, match="unknown peer selection"):
        choose_peer("star", ["a", "b"], "a", 0, random.Random())
    with pytest.raises(ValueError, match="unknown peer selection"):
        PeerSelector("star", "a")


def test_peer_selector_maps_back_to_members() -> None:
    peers = [Member(n, f"{n}:1") for n in ("b", "c", "d")]
    sel = PeerSelector("exponential", "a", random.Random(0))
    assert [sel.choose(peers, r).node_id for r in range(3)] == ["b", "c", "b"]
    assert PeerSelector("ring", "d").choose(peers, 0).node_id == "b"
    assert PeerSelector("random", "a", random.Random(0)).choose(peers, 0) in peers
    with pytest.raises(ValueError, match="no peers"):
        sel.choose([], 0)


def members(n: int) -> list[Member]:
    return [Member(node_id=name, addr=f"127.0.0.1:{7000 + i}") for i, name in enumerate(ids(n))]


@pytest.mark.parametrize("strategy", ["exponential", "ring", "random"])
@pytest.mark.parametrize(("n", "k"), [(8, 1), (8, 2), (8, 3), (3, 2), (3, 5), (2, 2)])
def test_choose_many_gives_distinct_peers_never_ourselves(strategy: str, n: int, k: int) -> None:
    everyone = members(n)
    me = everyone[0].node_id
    sel = PeerSelector(strategy, me, random.Random(1))
    for r in range(6):
        chosen = sel.choose_many(everyone, r, k)
        names = [m.node_id for m in chosen]
        assert len(names) == min(k, n - 1) and len(set(names)) == len(names) and me not in names


def test_choose_many_takes_consecutive_edges_of_the_exponential_graph() -> None:
    everyone = members(8)
    sel = PeerSelector("exponential", everyone[0].node_id, random.Random(1))
    assert [m.node_id for m in sel.choose_many(everyone, 0, 3)] == [everyone[1].node_id, everyone[2].node_id,
                                                                    everyone[4].node_id]
    # one peer a round is the one-peer graph of choose()
    for r in range(5):
        assert sel.choose_many(everyone, r, 1) == [sel.choose(everyone, r)]
    ring = PeerSelector("ring", everyone[5].node_id)
    assert [m.node_id for m in ring.choose_many(everyone, 0, 2)] == [everyone[6].node_id, everyone[7].node_id]
