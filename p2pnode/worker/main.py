"""The worker process: train, publish, average in what the daemon hands over.

Started with the ``spawn`` method so it shares nothing with the daemon but one pipe. It never
waits on the network: peer payloads arrive already fetched, and are taken between steps.
"""

from __future__ import annotations

import logging
import math
import time
from multiprocessing.connection import Connection
from typing import Any

import torch

from p2pnode import checkpoint
from p2pnode.config import Config
from p2pnode.config.mode_rule import sync_of
from p2pnode.data import DataError
from p2pnode.partition import histogram
from p2pnode.pipe_protocol import (ADOPT, FETCH_FALLBACK, Applied, Evaluated, Message, Parts, PeerPayload, Progress,
                                   Published)
from p2pnode.sync.messages import FINAL, FINAL_ROUND, SyncContribute, SyncResult
from p2pnode.sync.worker_allreduce import AllReduce
from p2pnode.sync.worker_powersgd import PowerSync, from_wire, to_wire
from p2pnode.wire.codec import payload_limit
from p2pnode.wire.mapped import peer_body
from p2pnode.wire.payload import ArchitectureMismatch, NonFiniteError, PayloadError
from p2pnode.wire.replica import ReplicaCache, ReplicaGap, keep_genesis, replica_folder
from p2pnode.worker.averaging import average_into, peer_weight, relative_distance
from p2pnode.worker.batchnorm import batchnorm_layers, second_moments_to_variances, variances_to_second_moments
from p2pnode.worker.finish_guard import Figures, FinishGuard
from p2pnode.worker.outer import OuterNesterov
from p2pnode.worker.process import PeerLoop, run_spawned
from p2pnode.worker.public import floating_state
from p2pnode.worker.robust import applied_clip, clip_payload, make_clipper, outlier_refusal
from p2pnode.worker.trainer_loop import TrainerLoop
from p2pnode.sync.values import resolve as resolve_values
from p2pnode.worker.training import ADAPTIVE, RECOVERY_STEPS

log = logging.getLogger("p2pnode.worker")


class Worker(TrainerLoop, PeerLoop):
    def __init__(self, conn: Connection, cfg: Config, node_id: str) -> None:
        #: the outer step's state in the checkpoint resumed from (resume_extra), restored below
        self._outer_state: Any = None
        super().__init__(conn, cfg, node_id)
        t = cfg.training
        self.outer = OuterNesterov(self.trainer.model, t.outer_lr, t.outer_momentum) if t.outer == "nesterov" else None
        if self.outer is not None and self._outer_state is not None:
            try:
                self.outer.load_state_dict(self._outer_state)
            except (KeyError, TypeError, ValueError) as exc:  # written under other settings
                log.warning("outer step state not restored (%s): the next round starts from the model", exc)
        self._outer_state = None
        self.replicas = ReplicaCache(cfg.exchange.max_replicas, replica_folder(cfg.node.state_dir))
        #: our x̂ at version 0 (a fresh start: the seeded initial model every fresh node shares),
        #: from which a peer's replica starts when our first fetch named it (wire/genesis.py)
        self.genesis = (keep_genesis(cfg.node.state_dir, self.spec, self.public.xhat)
                        if self.public.version == 0 else None)
        self.public.let_go()  # the genesis digest read every page of a file x_hat
        #: exchange.robust = "clip": the adaptive radius a peer's model is clipped to (robust.py)
        self.clipper = make_clipper(cfg.exchange.robust, cfg.exchange.clip_factor, cfg.exchange.clip_max,
                                    cfg.exchange.clip_refuse)
        self.dirty = False
        #: the consensus finish's guard: our model as training left it (worker/finish_guard.py)
        self.guard = FinishGuard()
        #: the figures of the last evaluation
        self.last_figures = Figures(float("nan"), float("nan"), 0)
        self.waiting = (cfg.training.min_peers > 0 or cfg.training.start_settle > 0) and not self.resumed
        self.published_step = self.trainer.step
        #: the synchronous mode (exchange.sync, resolved: config/mode_rule.py): the gradients'
        #: all-reduce (p2pnode/sync/)
        # the parameters training moves: a frozen layer has no gradient to average (each step's
        # mean was refused for its missing gradient, and every step was a local one)
        trained: list[tuple[str, torch.Tensor]] = [(n, p) for n, p in self.trainer.model.named_parameters()
                                                   if p.requires_grad]
        self.sync = (PowerSync(trained, cfg.exchange.sync_rank, cfg.training.seed,
                               resolve_values(cfg.exchange.sync_values, isinstance(self.trainer.optimizer, ADAPTIVE)))
                     if sync_of(cfg) == "powersgd" else None)
        self.all_reduce = (AllReduce(self.trainer, self.sync, self.sync_phase, cfg.exchange.sync_keep_pace)
                           if self.sync is not None else None)
        self.sync_result: SyncResult | None = None

    def resume_extra(self, state: dict[str, Any]) -> None:
        self._outer_state = state.get("outer")

    def hello(self) -> None:
        t = self.trainer
        self.send(self.hello_message(
            classes=histogram(t.train_split.labels.numpy(), int(getattr(t.task, "num_classes", 0))),
            batchnorm=len(batchnorm_layers(t.model)), optimizer=type(t.optimizer).__name__,
            adaptive=isinstance(t.optimizer, ADAPTIVE)))
        self.finished_before()

    def finished_before(self) -> None:
        """Resumed from a checkpoint written after training ended: no step will ever send the
        Progress that tells the daemon so (it would wait for steps forever and never exchange,
        found by scripts/chaos.py killing a finished node), so say it now, with the final figure."""
        t = self.trainer
        if t.done:
            self.send(Progress(step=t.step, samples=t.samples, loss=t.loss_ema, done=True, lr=t.lr_now(),
                               nonfinite=t.nonfinite_steps))
            self.evaluate(0)

    def checkpoint_state(self) -> dict[str, Any]:
        state = super().checkpoint_state()
        if self.outer is not None:
            state["outer"] = self.outer.state_dict()
        return state

    def on_peer(self, msg: PeerPayload) -> None:
        reason = ""
        try:
            limit = payload_limit(self.spec, self.cfg.http.max_payload_bytes)
            with peer_body(msg.data, msg.path) as (data, release):  # a big body: from the daemon's file
                replica = self.replicas.apply(msg.peer, data, self.spec, limit,
                                              self.genesis if msg.genesis else None, release)
        except OSError as exc:  # the daemon's spooled file is gone (it gave up waiting): ours, not the peer's
            reason, detail = "gap", f"spooled body unreadable: {exc}"
        except ArchitectureMismatch as exc:
            reason, detail = "architecture", str(exc)
        except NonFiniteError as exc:
            reason, detail = "non-finite", str(exc)
        except ReplicaGap as exc:
            reason, detail = "gap", str(exc)
        except PayloadError as exc:
            reason, detail = "malformed", str(exc)
        if reason:
            self.send(Applied(token=msg.token, ok=False, peer=msg.peer, reason=reason, detail=detail[:300]))
            return
        if self.guard.kept_own and self.trainer.done and msg.mode != ADOPT:
            # the finish's merge was refused: the replica is kept in step, nothing is averaged,
            # and no distance is reported (the daemon's agreement stays as it was)
            self.send(Applied(token=msg.token, ok=True, peer=msg.peer, epoch=replica.epoch,
                              version=replica.version, weight=0.0, distance=-1.0))
            return
        weight = 1.0 if msg.mode == ADOPT else peer_weight(
            self.cfg.exchange.averaging, self.trainer.loss_ema, replica.loss, msg.nth)
        distance = relative_distance(self.trainer.model, replica.tensors)
        clip = clip_payload(self.clipper, msg, distance, self.trainer.done)
        if clip is not None and clip.refused and self.clipper is not None:
            self.send(outlier_refusal(self.clipper, msg, clip, distance, replica.epoch, replica.version))
            return
        if clip is not None:  # x + w clip(x_peer - x, tau) is averaging with weight w * min(1, tau / d)
            weight *= clip.scale
            log.debug("peer %s at distance %.4f, radius %.4f: weight %.4f", msg.peer, distance, clip.radius, weight)
        average_into(self.trainer.model, replica.tensors, weight, clip.scale if clip is not None else 1.0)
        log.debug("averaged %s's copy of its step %d at our step %d (round's payload %d, weight %.4f, distance %.4f)",
                  msg.peer, replica.step, self.trainer.step, msg.nth, weight, distance)
        if msg.mode == ADOPT:
            t = self.trainer
            if self.sync is None:  # momentum of a few steps on a model we just replaced means nothing
                t.optimizer.state.clear()
            elif replica.step != t.step:
                # the synchronous mode's catch-up (momentum kept: a fresh worker has none yet, and
                # by the second catch-up it is built from the same means as the others'): the
                # model has taken the group's steps, and so have we, as a worker rejoining DDP; our
                # batch stream moves on by as many (the batches of the steps we were away for are
                # skipped, not the rest of the shard). Back too, when local steps taken while we
                # were behind put our count ahead: a count ahead ends training early, and the
                # models' mean then takes a model that many steps old (measured: 1 pt lost)
                t.seek(max(0, t.drawn + replica.step - t.step))
                t.samples += (replica.step - t.step) * self.cfg.training.batch_size
                t.step = replica.step
            if self.outer is not None:
                self.outer.restart(self.trainer.model)
            # the whole adopted model published before the answer: the daemon serves it from then on
            self.publish(full=True)
        elif self.outer is not None and not self.trainer.done:
            self.outer.step(self.trainer.model)  # after training: plain averages (consensus finish)
        self.dirty = True
        self.send(Applied(token=msg.token, ok=True, peer=msg.peer, epoch=replica.epoch,
                          version=replica.version, weight=weight, distance=distance, **applied_clip(clip)))

    def evaluate(self, samples: int, consensus: bool = False) -> None:
        acc, loss, n = self.trainer.evaluate(samples)
        kept = False
        if consensus and self.guard.check(self.trainer.model, Figures(acc, loss, n)):
            self.publish(full=True)  # our own model again, whole: peers still averaging move to it
            acc, loss, n = self.trainer.evaluate(samples)
            kept = True
        self.send(Evaluated(step=self.trainer.step, accuracy=acc, loss=loss, samples=n,
                            metrics=dict(self.trainer.metrics), consensus=consensus, kept_own=kept))
        self.last_figures = Figures(acc, loss, n)

    def finished(self) -> bool:
        return self.trainer.done

    def evaluate_all(self, consensus: bool) -> None:
        self.evaluate(0, consensus=consensus)

    def publish_asked(self) -> None:
        # exchange.sync: fetched only by a node catching up, which adopts it: the model whole
        self.publish(full=self.sync is not None)

    def on_other(self, msg: Message) -> None:
        if isinstance(msg, SyncResult):
            self.sync_result = msg

    def step(self) -> None:
        t, c = self.trainer, self.cfg
        loss = t.train_step(self.all_reduce)
        if not math.isfinite(loss):
            self.recover()
        if c.compression.publish_on == "steps":
            if t.step % c.compression.publish_every == 0:
                self.publish()
        elif t.done or t.step - self.published_step >= FETCH_FALLBACK * c.compression.publish_every:
            # publish_on = "fetch": the last local steps (for the consensus finish), and a copy
            # nobody fetched for a while: peers that refuse ours as an outlier (a node resumed
            # from an old checkpoint) must see it move as our model comes back towards theirs
            self.publish()
        self.send(Progress(step=t.step, samples=t.samples, loss=loss, done=t.done, lr=t.lr_now(),
                           nonfinite=t.nonfinite_steps, batch_share=t.batch_share))
        every = c.training.eval_every
        if every and t.step % every == 0:
            self.evaluate(c.training.eval_samples)
        if t.done:
            if self.sync is not None:
                self.final_mean()
            # the final figure on the whole test set; the consensus finish's guard keeps it
            self.evaluate(0)
            self.guard.training_ended(self.trainer.model, self.last_figures)

    def final_mean(self) -> None:
        """exchange.sync, after the last step: our model becomes the mean of every node's (what
        a node missed on the way, a restart or a late round, is evened out, and all end alike).
        BatchNorm statistics are first recomputed over our shard and sent as (mean, E[x^2]), so
        their mean is the statistics of every node's data together, not of our shard alone: on
        Dirichlet 0.1 shards our own classes' statistics left a ShuffleNet 6-28 pt under the
        same weights with statistics of all the data (docs/ALGORITHMS.md, "BatchNorm on
        label-skewed shards"); the evaluations after it keep them
        (``ShardTrainer.norms_pooled``)."""
        model = self.trainer.model
        pooled = self.trainer.refresh_norms() > 0
        if pooled:
            variances_to_second_moments(model)
        try:
            merged = self._final_mean(floating_state(model))
        finally:
            if pooled:
                second_moments_to_variances(model)
        if merged:
            self.trainer.norms_pooled = pooled
            self.publish(full=True)

    def _final_mean(self, state: dict[str, torch.Tensor]) -> bool:
        """``state`` replaced by the network's mean of it; False: none came, or it was refused."""
        result = self.sync_phase(FINAL, FINAL_ROUND, to_wire(list(state.values()), "float32"))
        if result is None or not result.data:
            return False
        try:
            flat = from_wire(result.data, sum(v.numel() for v in state.values()), "float32")
        except ValueError as exc:
            log.warning("the models' mean refused (%s): we keep ours", exc)
            return False
        with torch.no_grad():
            at = 0
            for tensor in state.values():
                tensor.copy_(flat[at:at + tensor.numel()].view_as(tensor))
                at += tensor.numel()
        return True

    def sync_phase(self, phase: int, rnd: int, data: bytes, took: float = 0.0) -> SyncResult | None:
        """Send one phase's contribution and wait for its mean (handling what else comes)."""
        x = self.cfg.exchange
        self.sync_result = None
        self.send(SyncContribute(phase=phase, round=rnd, data=data, took=took))
        deadline = time.monotonic() + 2 * (x.sync_timeout + x.timeout) + 1.0
        while self.running:
            got = self.sync_result
            if got is not None and got.phase == phase and (phase == 0 or got.round == rnd):
                return got
            left = deadline - time.monotonic()
            if left <= 0 or not self.conn.poll(left):
                log.warning("no all-reduce result for phase %d in time: a local step", phase)
                return None
            self.handle(self.receive())
        return None

    def publish(self, full: bool = False) -> None:
        """x_hat += top-k of x - x_hat (every entry with ``full``), and the encoded delta to the
        daemon, which serves it."""
        t = self.trainer
        self.send(Published(version=self.public.version + 1,
                            delta=Parts(self.public.publish_parts(t.step, t.loss_ema, full=full))))
        self.published_step = t.step
        self.release()

    def recover(self) -> None:
        """The model has diverged (non-finite loss): go back to our public copy x_hat, which the
        wire guarantees finite and which is at most a few publishes old, drop momentum, and halve
        the step size: restoring the same model into the same step would diverge again."""
        scale = self.trainer.diverged()
        log.error("non-finite loss at step %d: restored the model from its public copy; step size now "
                  "%.4g x lr (doubled back after %d finite steps)", self.trainer.step, scale, RECOVERY_STEPS)
        with torch.no_grad():
            for name, tensor in floating_state(self.trainer.model).items():
                tensor.copy_(self.public.xhat[name].view_as(tensor))
                self.public.let_go(name)
        self.trainer.optimizer.state.clear()
        if self.outer is not None:
            self.outer.restart(self.trainer.model)

    def publish_averaged(self) -> None:
        """After training ends, keep publishing what averaging changed (at most once per
        ``exchange.finish_interval``), so peers converge on one model (the consensus finish)."""
        self.dirty = False
        self.publish()

    def loop(self) -> None:
        last_idle_publish = 0.0
        while self.running:
            idle = self.trainer.done or self.waiting or self.held()
            # Between steps take everything waiting; when training is over, block briefly.
            while self.running and self.conn.poll(0.05 if idle else 0):
                self.handle(self.receive())
                idle = False
            if not self.running:
                break
            if self.waiting or self.held():
                continue
            if not self.trainer.done:
                self.step()
            elif self.dirty and time.monotonic() - last_idle_publish >= self.cfg.exchange.finish_interval:
                last_idle_publish = time.monotonic()
                self.publish_averaged()


def run(conn: Connection, cfg_dict: dict[str, Any], node_id: str) -> None:
    """Entry point of the spawned process (p2pnode/worker/process.py)."""
    def make() -> Worker:
        cfg = Config.from_dict(cfg_dict)
        logging.basicConfig(level=cfg.node.log_level.upper(), format="%(asctime)s worker %(levelname)s %(message)s")
        return Worker(conn, cfg, node_id)

    run_spawned(conn, make, (DataError, checkpoint.CheckpointError, ValueError))
