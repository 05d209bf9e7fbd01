"""When a fresh node takes its first step: the gate before training (docs/ALGORITHMS.md,
"A start together").

Nodes that start apart on skewed shards train apart: each learns its own classes first, and the
later averages never fully give back what the first minutes drifted (measured: 4 nodes on
Dirichlet-0.1 shards started 30 s apart ended 7-8 pt under the same run started together). DDP's
ranks wait for each other; a node cannot know how many peers are coming, so two gates:

- ``training.min_peers`` > 0 (set by whoever knows the cluster's size): wait until that many peers
  are alive, or ``training.min_peers_wait`` has passed;
- otherwise ``training.start_settle`` > 0 (the default): wait until membership has stopped growing
  for that many seconds (every new member starts the window again), or until a peer is seen
  training already (a cluster that is running: waiting would gain nothing), bounded by
  ``training.min_peers_wait``. Nodes started within the window of each other start together; a
  node alone pays the window once.

Only a fresh start waits: a worker resumed from a checkpoint steps at once (it never waits for
``Begin``), and so does the daemon here.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable

from p2pnode.config import Config
from p2pnode.daemon.state import TrainingState
from p2pnode.membership.base import Member, Membership
from p2pnode.net.client import PeerClient, PeerError

log = logging.getLogger("p2pnode.daemon")

#: seconds between two looks at membership while waiting
POLL = 0.5
#: seconds between two asks of each peer whether it trains already, and the timeout of one ask
ASK_EVERY, ASK_TIMEOUT = 2.0, 1.0
#: peers asked per look (a large cluster's joiner asks a few, not all)
ASK_AT_MOST = 4


def settles(cfg: Config) -> bool:
    """Whether a fresh node waits for membership to settle (``start_settle``, min_peers unset)."""
    return cfg.training.min_peers == 0 and cfg.training.start_settle > 0


async def wait_for_peers(cfg: Config, membership: Membership, state: TrainingState) -> None:
    """training.min_peers: hold a fresh worker's first step until that many peers are alive
    (or min_peers_wait has passed), as DDP's ranks wait for each other."""
    want, deadline = cfg.training.min_peers, time.monotonic() + cfg.training.min_peers_wait
    while want > 0 and (have := len(membership.alive_peers())) < want:
        if time.monotonic() >= deadline:
            log.warning("training starts with %d of the %d peers training.min_peers asks for "
                        "(training.min_peers_wait = %gs passed)", have, want, cfg.training.min_peers_wait)
            break
        if state.waiting_for_peers != [have, want]:
            log.info("waiting for peers before the first step: %d of %d alive (training.min_peers)", have, want)
        state.waiting_for_peers = [have, want]
        await asyncio.sleep(POLL)
    state.waiting_for_peers = None


async def peer_training(client: PeerClient, peer: Member) -> bool:
    """Whether ``peer`` says (GET /v1/status) its training has begun. An error or a slow answer
    is a no: the window goes on."""
    try:
        resp = await client.request("GET", peer.addr, "/v1/status", timeout=ASK_TIMEOUT)
        if resp.status != 200:
            return False
        training = json.loads(resp.body).get("training") or {}
        return int(training.get("step") or 0) > 0 or bool(training.get("done"))
    except (PeerError, ValueError, TypeError, AttributeError):
        return False


async def settle(cfg: Config, membership: Membership, state: TrainingState,
                 training: Callable[[Member], Awaitable[bool]]) -> str:
    """training.start_settle: wait until no new member has appeared for ``start_settle``
    seconds, a peer trains already (``training``), or ``min_peers_wait`` has passed. Returns
    why the wait ended ("settled", "peer training", "waited out")."""
    window, started = cfg.training.start_settle, time.monotonic()
    seen: set[str] = set()
    last_growth = started
    asked_at = 0.0
    log.info("waiting for membership to settle before the first step (training.start_settle = %gs)", window)
    try:
        while True:
            now = time.monotonic()
            alive = membership.alive_peers()
            new = {p.node_id for p in alive} - seen
            if new:
                seen |= new
                last_growth = now
                log.info("%d peer(s) joined (%d alive): the start waits %gs more", len(new), len(alive), window)
            if now - asked_at >= ASK_EVERY and alive:
                asked_at = now
                answers = await asyncio.gather(*(training(p) for p in alive[:ASK_AT_MOST]))
                if any(answers):
                    log.info("a peer is training already: starting now (%d alive)", len(alive))
                    return "peer training"
            if now - last_growth >= window:
                log.info("membership settled (%d alive, no new member for %gs): starting", len(alive), window)
                return "settled"
            if now - started >= cfg.training.min_peers_wait:
                log.warning("training starts before membership settled (training.min_peers_wait = %gs passed)",
                            cfg.training.min_peers_wait)
                return "waited out"
            state.settling = [len(alive), round(window - (now - last_growth), 1)]
            await asyncio.sleep(POLL)
    finally:
        state.settling = None
