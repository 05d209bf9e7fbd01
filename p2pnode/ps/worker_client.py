"""A parameter-server worker's training process (``node.role = "ps-worker"``).

Each round: take the server's weights (delivered by the daemon as a ``PeerPayload`` in
"adopt" mode: the whole model replaced), compute one batch's gradient, pass it through
``compression.gradient`` (with ``gradient_memory``: error feedback), encode it
(``ps/worker_gradient.py``) and hand it to the daemon, which pushes it and pulls the next weights,
then says ``PsRoundEnd``. Unlike a peer, a PS worker does wait for the network: pull, compute,
push is the classic asynchronous parameter server, and that wait is what the comparison
measures. The wait is bounded (twice ``exchange.timeout`` plus a second): with the server
gone, the worker computes on the weights it has.
"""

from __future__ import annotations

import logging
import math
import time
from multiprocessing.connection import Connection
from typing import Any

import torch
import torch.nn.functional as F

from p2pnode.config import Config
from p2pnode.data import DataError
from p2pnode.pipe_protocol import Applied, Message, PeerPayload, Progress
from p2pnode.ps.worker_gradient import encode_gradient
from p2pnode.ps.messages import PsGradient, PsRoundEnd
from p2pnode.wire.codec import decode as decode_payload
from p2pnode.wire.codec import payload_limit
from p2pnode.wire.payload import PayloadError, Snapshot
from p2pnode.wire.replica import Replica, ReplicaGap
from p2pnode.worker.process import run_spawned
from p2pnode.worker.public import floating_state
from p2pnode.worker.trainer_loop import TrainerLoop
from p2pnode.worker.training import ShardTrainer

log = logging.getLogger("p2pnode.worker")


def batch_loss(trainer: ShardTrainer) -> tuple[torch.Tensor, int]:
    """The loss of the trainer's next batch of its shard, and the batch's size."""
    batch = trainer._next_batch()
    task = getattr(trainer, "task", None)
    if task is not None:  # the task interface (training.task)
        from p2pnode.tasks import loader

        return task.loss(trainer.model, batch), int(loader.batch_len(batch))
    images, labels = batch
    return F.cross_entropy(trainer.model(images), labels), int(labels.shape[0])


def gradient_dtype(value_dtype: str) -> str:
    """The value type of a pushed gradient: int8 rounds every entry under half its scale to 0 and,
    unlike a published delta (whose rounding stays in x - x_hat), a push has no residual to carry
    it: so int8 pushes go as float32; float16 is kept."""
    return "float32" if value_dtype == "int8" else value_dtype


class PsWorker(TrainerLoop):
    def __init__(self, conn: Connection, cfg: Config, node_id: str) -> None:
        # model, shard, gradient compression, test set; never resumed: a PS worker has no model
        # of its own, and what it serves is its starting weights
        super().__init__(conn, cfg, node_id, resume=False)
        self.server: Replica | None = None  # our copy of the server's weights
        self.params = dict(self.trainer.model.named_parameters())
        self.round_over = False  # the first round: the daemon's first pull of the weights
        self.final_evaluated = False
        self.waited = 0.0  # seconds spent waiting for the server, for the log

    def on_weights(self, msg: PeerPayload) -> None:
        """The server's weights (snapshot or delta since the version we hold): adopt them."""
        try:
            payload = decode_payload(msg.data, self.spec, payload_limit(self.spec, self.cfg.http.max_payload_bytes))
            if isinstance(payload, Snapshot):
                replica = Replica(self.spec, payload.header.node_id)
            elif self.server is None or self.server.node_id != payload.header.node_id:
                self.send(Applied(token=msg.token, ok=False, peer=msg.peer, reason="gap", detail="no replica"))
                return
            else:
                replica = self.server
            replica.apply(payload)
        except PayloadError as exc:
            reason = "gap" if isinstance(exc, ReplicaGap) else "malformed"
            self.send(Applied(token=msg.token, ok=False, peer=msg.peer, reason=reason, detail=str(exc)[:300]))
            return
        self.server = replica
        with torch.no_grad():
            for name, tensor in floating_state(self.trainer.model).items():
                tensor.copy_(replica.tensors[name].view_as(tensor))
        self.send(Applied(token=msg.token, ok=True, peer=msg.peer, epoch=replica.epoch, version=replica.version,
                          weight=1.0))

    def on_message(self, msg: Message) -> None:
        if isinstance(msg, PeerPayload):
            self.on_weights(msg)
        elif isinstance(msg, PsRoundEnd):
            self.round_over = True

    def checkpoint_state(self) -> dict[str, Any]:
        """The weights this worker last pulled (and its counters): what it would evaluate."""
        return self.trainer.state_dict()

    def step(self) -> None:
        t = self.trainer
        t.model.train()
        before = {k: v.clone() for k, v in floating_state(t.model).items() if k not in self.params}
        for p in self.params.values():
            p.grad = None
        loss, count = batch_loss(t)
        value = float(loss.detach())
        t.step += 1
        t.samples += count
        if math.isfinite(value):
            loss.backward()
            t.gradients.begin_step()
            changes = {name: t.gradients.apply(name, p.grad) for name, p in self.params.items() if p.grad is not None}
            changes.update({k: v - before[k] for k, v in floating_state(t.model).items() if k in before})
            t.loss_ema = value if math.isnan(t.loss_ema) else 0.95 * t.loss_ema + 0.05 * value
            base = self.server.version if self.server is not None else 0
            epoch = self.server.epoch if self.server is not None else ""
            data = encode_gradient(changes, self.spec, self.node_id, epoch or self.public.epoch, base, t.step, value,
                                   gradient_dtype(self.cfg.compression.value_dtype))
            self.round_over = False
            self.send(PsGradient(step=t.step, base_version=base, data=data))
        else:
            t.nonfinite_steps += 1
        self.send(Progress(step=t.step, samples=t.samples, loss=value if math.isfinite(value) else 0.0, done=t.done,
                           lr=t.lr_now(), nonfinite=t.nonfinite_steps))

    def wait_round(self, wait: float) -> None:
        """Handle what the daemon sends until the round is over (at most ``wait`` seconds)."""
        started = time.monotonic()
        deadline = started + wait
        while self.running and not self.round_over:
            left = deadline - time.monotonic() if self.server is not None else 1.0  # the first weights: no limit
            if left <= 0 or not self.conn.poll(left):
                if self.server is None:
                    continue
                log.warning("a round with the server took over %.1f s; computing on the weights we hold", wait)
                self.round_over = True
                break
            self.handle(self.receive())
        while self.running and self.conn.poll(0):
            self.handle(self.receive())
        self.waited += time.monotonic() - started

    def loop(self) -> None:
        wait = 2 * self.cfg.exchange.timeout + 1.0
        while self.running:
            self.wait_round(wait)
            if not self.running:
                break
            if not self.trainer.done:
                self.step()
                every = self.cfg.training.eval_every
                if every and self.trainer.step % every == 0:
                    self.evaluate(self.cfg.training.eval_samples)
            elif not self.final_evaluated:
                self.final_evaluated = True
                # the weights last pulled: the server's figure is the one that counts (its own
                # evaluation on the whole test set), so only training.eval_samples images here
                self.evaluate(self.cfg.training.eval_samples)
            elif self.conn.poll(0.5):
                self.handle(self.receive())


def run(conn: Connection, cfg_dict: dict[str, Any], node_id: str) -> None:
    """Entry point of the spawned process (``node.role = "ps-worker"``; p2pnode/worker/process.py)."""
    run_spawned(conn, lambda: PsWorker(conn, Config.from_dict(cfg_dict), node_id), (DataError, ValueError))
