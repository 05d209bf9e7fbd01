"""The supervisor: builds a node's actors, runs them in one TaskGroup, shuts them down in order.

Actors: HTTP server, membership, worker supervisor, checkpointer, systemd watchdog, and the
mode's (gossip's exchange, a ps-worker's push and pull; p2pnode/modes.py picks the mode, whose
interface is p2pnode/daemon/mode.py). Membership, the mode's actors and the checkpointer are
restarted with a back-off if they crash; a worker that cannot train at all stops the node with
exit code 1. SIGTERM/SIGINT: stop accepting requests, tell peers we leave, write a final
checkpoint, exit 0 — within 10 s.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import ssl
import time
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from p2pnode import __version__
from p2pnode.config import Config, adaptive_gossip, mode_rule, parse_hostport
from p2pnode.dashboard import routes as dashboard
from p2pnode.daemon import bulk_threads, early_signals, identity, journal, notify, start_gate
from p2pnode.exchange.rounds import Exchange
from p2pnode.daemon.http import HttpApi, NodeView
from p2pnode.daemon.looplag import LoopLag
from p2pnode.malloc import return_big_frees
from p2pnode.priority import realtime_loop_thread
from p2pnode.daemon.metrics import NodeMetrics
from p2pnode.daemon.mode import Mode, ModeBytes, NodeParts
from p2pnode.daemon.pipe import FINAL_FLOOR, final_checkpoint_timeout
from p2pnode.daemon.supervisor import WorkerFailed, WorkerSupervisor
from p2pnode.membership.base import JoinError, Membership, MemberState
from p2pnode.membership.simple import SimpleMembership
from p2pnode.modes import mode_for
from p2pnode.net.client import PeerClient

log = logging.getLogger("p2pnode.node")

MEMBERS_FILE = identity.MEMBERS_FILE


class ShutdownRequested(Exception):
    """Raised by the stopper actor once the graceful steps are done, to end the TaskGroup."""


def _server_ssl(cfg: Config) -> ssl.SSLContext | None:
    if not cfg.node.tls_cert:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cfg.node.tls_cert, cfg.node.tls_key)
    return ctx


def _client_ssl(cfg: Config) -> ssl.SSLContext | None:
    if not cfg.node.tls_cert:
        return None
    ctx = ssl.create_default_context(cafile=cfg.node.tls_ca or cfg.node.tls_cert)
    ctx.check_hostname = False  # peers are addressed by IP; the certificate chain is still checked
    return ctx


def _secret(cfg: Config) -> bytes | None:
    if cfg.node.secret_file:
        return Path(cfg.node.secret_file).read_bytes().strip() or None
    return cfg.node.secret.encode() or None


class Node:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.state_dir = Path(cfg.node.state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.identity = identity.load_or_create(self.state_dir, cfg.node.id)
        self.node_id = self.identity.node_id
        self.metrics = NodeMetrics()
        #: the event loop's stalls (model-sized work on the loop shows up here)
        self.loop_lag = LoopLag(self.metrics.loop_lag, self.metrics.loop_lag_max)
        self.secret = _secret(cfg)
        self.client = PeerClient(self.secret, _client_ssl(cfg), user_agent=f"p2pnode/{__version__}")
        #: how this node trains with the others (gossip, the synchronous mode, a parameter server's role)
        self.mode_type = mode_for(cfg)
        self.mode: Mode | None = None  # built in run, on the parts below
        self.supervisor = WorkerSupervisor(cfg, self.node_id, self.metrics, self.mode_type.worker_module(cfg))
        self.started = time.monotonic()
        self.stop_event = asyncio.Event()
        self.addr = ""
        self.membership: Membership | None = None
        self.exchange: Exchange | None = None
        self.api: HttpApi | None = None
        self.joined = False
        #: member addresses saved in members.json (or found there) since we started
        self._remembered: set[str] = set()

    # --- pieces -----------------------------------------------------------------------------

    def _bind(self) -> socket.socket:
        host, port = parse_hostport(self.cfg.node.listen, "node.listen")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(512)
        sock.setblocking(False)
        return sock

    def _build_membership(self) -> Membership:
        m = self.cfg.membership
        if m.protocol == "swim":
            from p2pnode.membership.swim import SwimConfig, SwimMembership

            swim_cfg = SwimConfig.profile(m.profile, **m.swim_overrides())
            return SwimMembership(self.node_id, self.addr, self.client, swim_cfg, self.identity.incarnation,
                                  registry=self.metrics.registry, on_incarnation=self.identity.raise_to)
        return SimpleMembership(self.node_id, self.addr, self.client, self.identity.incarnation,
                                m.gossip_interval, m.timeout, self.cfg.exchange.fail_threshold)

    def _remembered_members(self) -> list[str]:
        hints = identity.load_hints(self.state_dir, self.addr)
        self._remembered.update(hints)
        return hints

    async def _remember_members(self, hints: list[str]) -> None:
        """Save ``hints`` (the membership's verified live members, bounded) off the event loop."""
        try:
            await asyncio.to_thread(identity.save_hints, self.state_dir, hints)
        except OSError as exc:  # hints for the next start: not worth stopping the node for
            log.warning("could not save the members (%s): %s", MEMBERS_FILE, exc)
            return
        self._remembered.update(hints)

    def status(self) -> dict[str, Any]:
        assert self.membership is not None and self.exchange is not None
        ex, st = self.exchange.status(), self.supervisor.state
        out: dict[str, Any] = {
            "node_id": self.node_id,
            "addr": self.addr,
            "version": __version__,
            "uptime_s": round(time.monotonic() - self.started, 3),
            "incarnation": self.identity.incarnation,
            "joined": self.joined,
            "stopping": self.stop_event.is_set(),
            "config": {"task": self.cfg.training.task or "builtin", "model": self.cfg.training.model,
                       "data": self.cfg.training.data,
                       "shard": self.cfg.training.shard, "averaging": self.cfg.exchange.averaging,
                       "gradient": self.cfg.compression.gradient,
                       # as the worker publishes and the rounds fetch (config/adaptive_gossip.py)
                       "publish": adaptive_gossip.publish_spec(self.cfg, st.adaptive, st.params),
                       "peers_per_round": adaptive_gossip.peers_per_round(self.cfg, st.adaptive, st.params),
                       "membership": self.cfg.membership.protocol},
            "training": self.supervisor.state.to_json(),
            # the mode, the setting and why (config/mode_rule.py), with what the worker knows
            "mode": {**mode_rule.status(mode_rule.choose(self.cfg), st.optimizer, st.adaptive, st.classes),
                     "adaptive_gossip": adaptive_gossip.said(self.cfg, st.adaptive, st.params)},
            "served_model": self.supervisor.model.status(),
            "exchanges": ex["totals"],
            "bootstrapped_from": ex["bootstrapped_from"],
            "bootstrap": ex["bootstrap"],
            "peers": ex["peers"],
            "consensus": ex["consensus"],
            "robust": ex["robust"],
            "pace": ex["pace"],
            "event_loop": self.loop_lag.status(),
            "pushes": {**self.api.pushes.status(), "accepted": self.api.pushes_accepted} if self.api else {},
            "members": [mb.to_json() for mb in self.membership.members()],
            "membership": self.membership.status(),
            "bytes": {"model_received": ex["totals"]["bytes_received"],
                      "model_served": self.api.bytes_served if self.api else 0,
                      "client_sent": self.client.bytes_sent, "client_received": self.client.bytes_received},
        }
        b = out["bytes"]
        moved = self.mode.bytes_moved() if self.mode is not None else ModeBytes()
        # every mode's model bytes in one pair, counted where gossip's are: what GET /v1/model
        # served and the exchange fetched, and what the mode moved itself (the synchronous
        # mode's contributions and means, a parameter server's pushes and pulls)
        b["sent"], b["received"] = b["model_served"] + moved.sent, b["model_received"] + moved.received
        b["routes_received"], b["routes_answered"] = moved.routes_received, moved.routes_answered
        if self.mode is not None:
            self.mode.status(out)
        return out

    # --- actors -----------------------------------------------------------------------------

    async def _supervised(self, name: str, fn: Callable[[], Awaitable[None]]) -> None:
        """Run an actor; if it crashes, log why and start it again after a back-off."""
        backoff = 0.5
        while True:
            try:
                await fn()
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                log.error("actor %s crashed; restarting in %.1f s\n%s", name, backoff, traceback.format_exc())
                await asyncio.sleep(backoff)
                backoff = min(30.0, backoff * 2)

    async def _checkpointer(self) -> None:
        interval = self.cfg.checkpoint.interval
        while True:
            await asyncio.sleep(interval if interval > 0 else 3600)
            # once the node is stopping, the stop writes the final checkpoint: a periodic one
            # asked for now would wait behind it and never be answered by the exiting worker
            if interval > 0 and self.supervisor.state.worker_alive and not self.stop_event.is_set():
                try:
                    await self.supervisor.pipe.checkpoint()
                except (TimeoutError, ConnectionError, OSError) as exc:
                    if self.stop_event.is_set():  # asked before the stop, then left to the final one
                        log.info("periodic checkpoint left to the final one (%r)", exc)
                    else:
                        log.warning("periodic checkpoint did not complete: %r", exc)
            if self.membership is not None:
                await self._remember_members(self.membership.hints())

    async def _member_gauges(self) -> None:
        assert self.membership is not None
        while True:
            counts = {s: 0 for s in MemberState}
            for mb in self.membership.members():
                counts[mb.state] += 1
            for state, n in counts.items():
                self.metrics.members.labels(str(state)).set(n)
            hints = self.membership.hints()
            if not set(hints) <= self._remembered:
                # a member we have not saved yet: saved now, not at the next checkpoint, so a node
                # killed before its first (a seed node above all, with no seeds of its own) finds
                # its cluster again when it restarts, instead of starting alone
                await self._remember_members(hints)
            await asyncio.sleep(1.0)

    async def _join(self) -> None:
        assert self.membership is not None
        await self.supervisor.clock.ready.wait()  # join once we can serve our model, not before
        seeds = list(dict.fromkeys(self.cfg.node.seeds + self._remembered_members()))
        seeds = [s for s in seeds if s != self.addr]
        if seeds:
            try:
                await self.membership.join(seeds)
            except JoinError:
                if self.cfg.node.seeds:
                    raise
                # remembered members are hints: a first node whose old peers are gone starts alone
                log.warning("no remembered member answered (%s); running alone until one does", ", ".join(seeds))
        self.joined = True
        if self.mode is not None:
            self.mode.joined()
        notify.notify(f"READY=1\nSTATUS=serving on {self.addr}, {len(self.membership.members())} members")

    async def _quorum(self) -> None:
        """Hold a fresh worker's first step until peers are there (daemon/start_gate.py):
        training.min_peers when set, else until membership settles (training.start_settle)."""
        assert self.membership is not None
        if self.cfg.training.min_peers > 0:
            await start_gate.wait_for_peers(self.cfg, self.membership, self.supervisor.state)
        elif start_gate.settles(self.cfg):
            await self.supervisor.clock.ready.wait()
            if not self.supervisor.clock.resumed:  # a resumed worker steps at once, never waits
                client = self.client
                await start_gate.settle(self.cfg, self.membership, self.supervisor.state,
                                        lambda peer: start_gate.peer_training(client, peer))
        await self.supervisor.begin()

    async def _stopper(self) -> None:
        await self.stop_event.wait()
        log.info("shutting down: leaving the cluster, writing a final checkpoint")
        notify.notify("STOPPING=1")
        assert self.membership is not None
        # systemd (and the tests) allow 10 s from SIGTERM to exit: for a small model the leave,
        # final checkpoint and a hung worker's 2 s grace before it is killed all fit in 7. A big
        # model's final checkpoint gets time from its size, and systemd is told to wait for it.
        started = time.monotonic()
        budget = final_checkpoint_timeout(self.supervisor.pipe.params)
        if budget > FINAL_FLOOR:
            notify.notify(f"EXTEND_TIMEOUT_USEC={int((budget + 5.0) * 1e6)}")
        try:
            async with asyncio.timeout(2.0):
                await self.membership.leave()
        except TimeoutError:
            log.warning("leave announcement did not finish in 2 s")
        await self.supervisor.stop(checkpoint=True, timeout=budget - (time.monotonic() - started))
        raise ShutdownRequested

    # --- life -------------------------------------------------------------------------------

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        return_big_frees()  # before the first model-sized buffer: p2pnode/malloc.py
        bulk_threads.install(loop)
        if self.cfg.node.loop_priority == "auto" and realtime_loop_thread():
            self.loop_lag.scheduling = "realtime"
        log.info("event loop's thread: %s scheduling (node.loop_priority = %s)", self.loop_lag.scheduling,
                 self.cfg.node.loop_priority)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop_event.set)
        if early_signals.requested() is not None:  # asked to stop while we were still importing
            log.info("stop requested (signal %d) before the node started; exiting", early_signals.requested())
            await self.client.close()
            return 0
        sock = self._bind()
        bound_host, bound_port = sock.getsockname()[:2]
        self.addr = self.cfg.node.advertise or f"{bound_host}:{bound_port}"
        self.membership = self._build_membership()
        sup = self.supervisor
        self.exchange = Exchange(self.cfg, sup.clock, sup.pipe, self.membership, self.client, self.metrics,
                                 self.node_id, lambda: sup.model.served.genesis if sup.model.served else "",
                                 spec=lambda: sup.model.served.spec if sup.model.served else None)
        exchange = self.exchange
        view = NodeView(starting=lambda: exchange.boot.pending, heard_step=exchange.pace.saw,
                        step_now=lambda: sup.state.step, joined=lambda: self.joined,
                        training=((lambda: sup.state.worker_alive and not sup.state.done)
                                  if self.mode_type.publishes_on_fetch else (lambda: False)))
        self.api = HttpApi(self.cfg, sup.model, sup.pipe, self.metrics, self.status,
                           lambda: sup.state.worker_alive, self.membership.pusher, view, self.mode_type.routes)
        app = self.api.build_app(self.secret)
        self.mode = mode = self.mode_type(NodeParts(self.cfg, self.node_id, sup, self.client, self.membership,
                                                    exchange, self.api, lambda: self.joined))
        mode.add_routes(app)
        sup.on_message = mode.on_message
        self.membership.add_routes(app)
        dashboard.install(app, self)  # GET /, /v1/history, /v1/cluster; its history sampler runs with the app
        # lingering_time: the unread rest of a refused body is drained for at most 1 s, not 10
        runner = web.AppRunner(app, access_log=None, handle_signals=False, lingering_time=1.0)
        await runner.setup()
        await web.SockSite(runner, sock, ssl_context=_server_ssl(self.cfg), shutdown_timeout=1.0).start()
        log.info("node %s listening on %s (state in %s)", self.node_id, self.addr, self.state_dir)
        if self.secret is None:
            log.warning("no cluster secret: any host that reaches %s can talk to this node (requests are not "
                        "authenticated); set node.secret_file (docs/OPERATIONS.md)", self.addr)
            if self.cfg.membership.protocol == "simple":
                # the simple protocol takes any member list and any leave it is sent (MEMBERSHIP.md)
                log.warning("membership.protocol = simple without a secret: any host can add members or "
                            "mark one left; use it only on a trusted network, or use swim (the default)")
        choice = mode_rule.choose(self.cfg)
        log.info("mode %s (exchange.sync = %s): %s", choice.name, choice.setting, choice.why)
        mode.start(self.secret)
        code = 0
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self.supervisor.run(), name="worker-supervisor")
                tg.create_task(self._stopper(), name="stopper")
                tg.create_task(self._join(), name="join")
                tg.create_task(self._quorum(), name="quorum")
                tg.create_task(self._supervised("membership", self.membership.run), name="membership")
                for name, actor in mode.actors().items():
                    tg.create_task(self._supervised(name, actor), name=name)
                tg.create_task(self._supervised("checkpointer", self._checkpointer), name="checkpointer")
                tg.create_task(self._member_gauges(), name="member-gauges")
                tg.create_task(notify.watchdog_loop(), name="watchdog")
                tg.create_task(self.loop_lag.run(), name="loop-lag")
                lg = self.cfg.logging  # the training journal, STATE_DIR/history.jsonl
                tg.create_task(journal.run(self.status, self.state_dir, lg.history_interval, lg.history_max_bytes),
                               name="journal")
        except* ShutdownRequested:
            log.info("stopped cleanly")
        except* WorkerFailed as eg:
            log.error("the training worker cannot run: %s", eg.exceptions[0])
            code = 1
        except* JoinError as eg:
            log.error("%s", eg.exceptions[0])
            code = 1
        finally:
            await mode.close()
            await self.supervisor.stop(checkpoint=False, timeout=1.0)
            await runner.cleanup()
            await self.client.close()
        return code
