"""Self-centred clipping (p2pnode/worker/robust.py): a poisoned model moves ours by at most
w * tau, an honest one closer than tau is averaged exactly, and tau follows honest distances but
cannot be widened by a hostile peer."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from p2pnode.config import Config, ConfigError, set_option
from p2pnode.pipe_protocol import PeerPayload
from p2pnode.worker.averaging import average_into, relative_distance
from p2pnode.worker.robust import (
    MIN_RATIO,
    ClipDecision,
    ClipRadius,
    clip_payload,
    make_clipper,
)


def flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([t.reshape(-1).float() for t in model.state_dict().values()])


def poisoned(model: nn.Module, attack: str) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    out = {}
    for name, t in model.state_dict().items():
        if attack == "sign-flip":
            out[name] = -t.clone()
        elif attack == "scale100":
            out[name] = 100 * t.clone()
        else:  # random, with the tensor's RMS
            out[name] = torch.randn(t.shape, generator=gen) * t.pow(2).mean().sqrt()
    return out


def test_before_any_history_the_radius_is_the_cap_and_a_far_model_is_scaled_to_it() -> None:
    clip = ClipRadius(factor=3.0, max_ratio=0.5)
    assert clip.radius() == 0.5
    d = clip.decide("evil", 1.5)  # a random model is about 1.4 ||x|| away
    assert d.clipped and not d.refused and d.scale == pytest.approx(1 / 3) and d.radius == 0.5
    near = clip.decide("honest", 0.05)
    assert not near.clipped and near.scale == 1.0


@pytest.mark.parametrize("attack", ["sign-flip", "scale100", "random"])
def test_a_poisoned_model_moves_ours_by_at_most_weight_times_radius(attack: str) -> None:
    """Clipping alone (refusal turned off): the bound ClippedGossip gives."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 10), nn.ReLU(), nn.Linear(10, 3))
    clip = ClipRadius(factor=3.0, max_ratio=0.5, refuse=math.inf)
    for _ in range(8):  # honest history: peers about 4 % away
        clip.decide("honest", 0.04)
    before = flat(model).clone()
    peer = poisoned(model, attack)
    distance = relative_distance(model, peer)
    decision = clip.decide("evil", distance)
    assert decision.clipped and decision.radius == pytest.approx(0.12)
    average_into(model, peer, 0.5 * decision.scale)
    moved = float((flat(model) - before).norm())
    assert moved <= 0.5 * decision.radius * float(before.norm()) * (1 + 1e-5)
    # unclipped, the same exchange would have moved it by half the distance: 8 to 400 times more
    assert 0.5 * distance * float(before.norm()) > 8 * moved


def test_an_honest_model_within_the_radius_is_averaged_exactly() -> None:
    torch.manual_seed(0)
    model = nn.Linear(8, 4)
    peer = {k: v + 0.01 * torch.randn_like(v) for k, v in model.state_dict().items()}
    expect = {k: (v + peer[k]) / 2 for k, v in model.state_dict().items()}
    decision = ClipRadius().decide("honest", relative_distance(model, peer))
    assert decision.scale == 1.0
    average_into(model, peer, 0.5 * decision.scale)
    for k, v in model.state_dict().items():
        assert torch.allclose(v, expect[k])


@pytest.mark.parametrize("attack", ["sign-flip", "scale100", "random"])
def test_a_poisoned_model_far_beyond_the_radius_is_refused_and_moves_nothing(attack: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 10), nn.ReLU(), nn.Linear(10, 3))
    clip = ClipRadius(factor=3.0, max_ratio=0.25, refuse=4.0)  # the defaults: the widest bound 1.0
    for _ in range(3):
        clip.decide("honest", 0.04)
    decision = clip.decide("evil", relative_distance(model, poisoned(model, attack)))
    assert decision.refused and decision.scale == 0.0
    # ...while an honest peer whose distance doubled since last time is still averaged (clipped at most)
    assert not clip.decide("honest", 0.08).refused


def test_a_node_whose_every_peer_looks_far_widens_the_radius_within_a_few_exchanges() -> None:
    """Our own model is the odd one (say, restored from an old checkpoint): refusals record tau
    too, so tau grows until the peers are averaged again."""
    clip = ClipRadius(factor=3.0, max_ratio=0.5, refuse=4.0)
    for _ in range(3):
        clip.decide("a", 0.01)
        clip.decide("b", 0.01)
    rounds = 0
    while clip.radius() < 0.4 / 4:
        clip.decide("a", 0.4)
        clip.decide("b", 0.4)
        rounds += 1
        assert rounds < 10, clip.radius()
    assert not clip.decide("a", 0.4).refused and not clip.decide("b", 0.4).refused


def test_an_honest_jump_is_clipped_once_and_refused_only_on_a_second_strike() -> None:
    """A copy that jumps once (a peer publishing on fetch served a stale copy) is clipped, not
    refused; far twice in a row it is refused; anything beyond refuse x max_ratio at once."""
    clip = ClipRadius(factor=3.0, max_ratio=0.25, refuse=4.0)
    for _ in range(3):
        clip.decide("a", 0.004)
        clip.decide("b", 0.004)
    tau = clip.radius()
    jump = clip.decide("a", 0.2)  # 16 x tau, under the widest bound 1.0
    assert not jump.refused and jump.clipped and jump.scale == pytest.approx(tau / 0.2)
    assert not clip.decide("a", 0.005).refused  # back near: the strike is forgotten
    assert not clip.decide("a", 0.2).refused  # a new first strike
    assert clip.decide("a", 0.2).refused  # far twice in a row
    assert clip.decide("b", 1.4).refused  # a random model: refused at first sight



def finished_cluster(done: bool) -> ClipRadius:
    """A node that trained beside peers a and b (honest distances 0.02-0.05), whose training
    then ended (``done``: as the worker says with each payload), and whose consensus finish
    then brought all three to the same model exactly: distances of 0, many times over."""
    clip = ClipRadius(factor=3.0, max_ratio=0.25, refuse=4.0)

    def payload(peer: str) -> PeerPayload:
        return PeerPayload(token=1, peer=peer, data=b"")

    for d in (0.05, 0.03, 0.02, 0.02):
        clip_payload(clip, payload("a"), d)
        clip_payload(clip, payload("b"), d)
    for d in (0.008, 0.003, 0.0005, 0.0, 0.0, 0.0, 0.0):  # the finish: our training is over
        clip_payload(clip, payload("a"), d, done)
        clip_payload(clip, payload("b"), d, done)
    return clip


def test_a_late_joiners_honest_model_is_averaged_after_the_others_agree_exactly() -> None:
    """Finished nodes agree to the bit; a node that joined late, adopted their model and has
    trained since on its own shard is 0.16 x ||x|| away (measured on Dirichlet-0.1 shards): its
    model is averaged, every time, not refused as an outlier because the radius fell to its
    floor. Without the settled radius it is refused on its second exchange (the defect)."""
    clip = finished_cluster(done=True)
    late = PeerPayload(token=2, peer="late", data=b"")
    for d in (0.16, 0.15, 0.17, 0.14, 0.12, 0.1):
        decision = clip_payload(clip, late, d, True)
        assert decision is not None and not decision.refused, (d, clip.radius())
        assert decision.scale >= 0.02 / d * 3 - 1e-9  # clipped at most to the radius of training
    # the radius of training, not the floor, and still under the cap
    assert 0.05 <= clip.radius() <= 0.25
    # a poisoned model is refused all the same, at first sight
    assert clip_payload(clip, PeerPayload(token=3, peer="evil", data=b""), 2.0, True).refused

    unsettled = finished_cluster(done=False)
    assert unsettled.radius() == MIN_RATIO
    assert not clip_payload(unsettled, late, 0.16).refused  # a first strike: clipped to 1e-4
    assert clip_payload(unsettled, late, 0.15).refused  # the second: real work refused


def test_a_hostile_minority_cannot_make_a_node_spread() -> None:
    """The far model is refused every time while the other peers are near, however often it comes."""
    clip = ClipRadius(factor=3.0, max_ratio=0.25, refuse=4.0)
    for _ in range(200):
        assert not clip.decide("a", 0.05).refused
        assert not clip.decide("b", 0.08).refused
        for far in (2.0, 1.4, 99.0):  # sign-flipped, random, x100
            decision = clip.decide("evil", far)
            assert decision.refused and not decision.spread


def simulate(models: list[np.ndarray], hostile: dict[int, str], exchanges: int, seed: int = 0,
             robust: bool = True) -> int:
    """Gossip with the worker's rule, in place: each exchange one node averages one random peer's
    model in with weight 1/2, clipped (``average_into``'s arithmetic on flat vectors; ``robust``
    False: whole, as with ``exchange.robust = "none"``); a hostile node serves a poisoned version
    of its model and never averages. Returns how many poisoned models were averaged in."""
    rng = np.random.default_rng(seed)
    clips = [ClipRadius() if robust else None for _ in models]
    taken = 0
    for _ in range(exchanges):
        i, j = rng.choice(len(models), size=2, replace=False)
        if i in hostile:
            continue
        peer = {"sign-flip": -models[j], "x100": 100 * models[j]}.get(hostile.get(j, ""), models[j])
        distance = float(np.linalg.norm(peer - models[i]) / np.linalg.norm(models[i]))
        clip = clips[i]
        decision = clip.decide(str(j), distance) if clip is not None else ClipDecision(1.0, math.inf)
        if not decision.refused:
            models[i] = models[i] + 0.5 * decision.scale * (peer - models[i])
            taken += j in hostile
    return taken


def test_nodes_that_trained_apart_come_together() -> None:
    """Four honest models 1.0-1.4 x ||x|| apart (nodes started at different times on skewed data:
    measured 0.97-1.24), beyond the refusal bound refuse x max_ratio = 1.0 for every pair: the
    rule of refusing them all would never mix them; spread, they converge."""
    rng = np.random.default_rng(3)
    base = rng.standard_normal(1000)
    models = [base + 1.1 * rng.standard_normal(1000) for _ in range(4)]
    gaps = [np.linalg.norm(a - b) / np.linalg.norm(a) for a in models for b in models if a is not b]
    assert min(gaps) > ClipRadius().refuse * ClipRadius().max_ratio
    simulate(models, {}, 400)
    worst = max(np.linalg.norm(a - b) / np.linalg.norm(a) for a in models for b in models)
    assert worst < 1e-3, worst


@pytest.mark.parametrize("attack", ["sign-flip", "x100"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_one_poisoned_node_of_four_barely_moves_the_honest_ones(attack: str, seed: int) -> None:
    """The same gossip with node 3 poisoned and the honest nodes near each other (they start from
    one seed): the honest peers keep every honest node from being spread, so the poisoned model is
    refused, but for a node whose first three exchanges all met the attacker (seed 0: once, a
    clipped 1/8 of ||x||); the honest models end together, their norm within 10 % of the start."""
    rng = np.random.default_rng(4)
    base = rng.standard_normal(1000)
    models = [base + 0.01 * rng.standard_normal(1000) for _ in range(4)]
    norm = np.linalg.norm(base)
    assert simulate(models, {3: attack}, 400, seed) <= 1
    honest = models[:3]
    assert max(np.linalg.norm(a - b) / norm for a in honest for b in honest) < 0.02
    for m in honest:
        assert abs(np.linalg.norm(m) / norm - 1) < 0.1, np.linalg.norm(m) / norm


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_without_clipping_one_sign_flipping_node_of_four_turns_the_honest_ones_into_its_poison(seed: int) -> None:
    """The damage the defence above prevents (what tests/test_poisoned_peer.py no longer runs on a
    real cluster): the same gossip with every model averaged in whole drags the honest models to
    the attacker's -x: they end pointing against where they started (with clipping: along it)."""
    def cosines(robust: bool) -> list[float]:
        rng = np.random.default_rng(4)
        base = rng.standard_normal(1000)
        models = [base + 0.01 * rng.standard_normal(1000) for _ in range(4)]
        taken = simulate(models, {3: "sign-flip"}, 400, seed, robust=robust)
        assert (taken > 10) if not robust else (taken <= 1)
        return [float(m @ base / (np.linalg.norm(m) * np.linalg.norm(base))) for m in models[:3]]

    assert all(c < -0.9 for c in cosines(robust=False))
    assert all(c > 0.99 for c in cosines(robust=True))


def test_a_hostile_peer_cannot_widen_the_radius_even_half_of_the_exchanges() -> None:
    clip = ClipRadius(factor=3.0, max_ratio=0.5)
    for i in range(400):
        clip.decide("honest", 0.04)
        # the hostile peer every other exchange, always just inside the radius it sees
        clip.decide("evil", 0.999 * clip.radius())
    assert clip.radius() == pytest.approx(0.12)  # 3 x the honest median, as at the start


def test_with_a_majority_of_honest_peers_the_radius_comes_from_them() -> None:
    clip = ClipRadius(factor=3.0, max_ratio=0.5)
    for _ in range(50):
        clip.decide("a", 0.03)
        clip.decide("b", 0.05)
        clip.decide("evil", 10.0)
    assert clip.radius() == pytest.approx(0.15)  # 3 x the lower median of (0.03, 0.05, 0.15)


def test_an_honest_distance_that_grows_is_followed() -> None:
    clip = ClipRadius(factor=3.0, max_ratio=0.5)
    for _ in range(16):
        clip.decide("a", 0.01)
    assert clip.radius() == pytest.approx(0.03)
    # the models drift apart 5x at once (say, the step size rose): clipped at first, then followed
    first = clip.decide("a", 0.05)
    assert first.clipped
    for _ in range(16):
        last = clip.decide("a", 0.05)
    assert not last.clipped and clip.radius() == pytest.approx(0.15)


def test_the_radius_never_exceeds_the_cap_and_bad_distances_move_nothing() -> None:
    clip = ClipRadius(factor=3.0, max_ratio=0.5)
    for _ in range(100):  # a lone hostile peer pushing its own figure up
        clip.decide("evil", 1e6)
    assert clip.radius() == 0.5
    for bad in (math.nan, math.inf, -1.0):
        assert clip.decide("evil", bad).refused


def test_peers_are_forgotten_least_recently_met_first() -> None:
    clip = ClipRadius(max_peers=4)
    for i in range(10):
        clip.decide(f"p{i}", 0.01 * (i + 1))
    assert list(clip.history) == ["p6", "p7", "p8", "p9"]


def test_config_choice() -> None:
    cfg = Config()
    assert cfg.exchange.robust == "clip"
    assert isinstance(make_clipper("clip", 3.0, 0.5, 4.0), ClipRadius)
    assert make_clipper("none", 3.0, 0.5, 4.0) is None
    with pytest.raises(ValueError):
        make_clipper("median", 3.0, 0.5, 4.0)
    for bad in ("exchange.robust=median", "exchange.clip_factor=0", "exchange.clip_max=-1", "exchange.clip_refuse=0.5"):
        cfg = Config()
        key, _, value = bad.partition("=")
        with pytest.raises(ConfigError, match=key):  # refused as it is decoded
            set_option(cfg, key, value)
