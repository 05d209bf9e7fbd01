"""The parameter server's worker process (``node.role = "ps"``): holds the model, applies each
pushed gradient as it comes, publishes the result for ``GET /v1/model``.

Asynchronous as in the paper's baseline (and TensorFlow's between-graph PS): pushes are
applied one at a time in arrival order with the configured momentum SGD (``training.lr``,
``momentum``, warm-up and schedule counted in samples pushed by all workers together), each on
whatever the model is then, however stale the weights the worker computed it on. Nothing here
waits for any worker. ``training.max_samples`` counts samples of all workers together: once
reached, the server evaluates on the whole test set and reports done (it keeps applying pushes).
Every push is published, by ``compression.publish`` (``topk:density=1`` serves the weights
exactly, as a classic parameter server does).
"""

from __future__ import annotations

import logging
import math
from multiprocessing.connection import Connection
from typing import Any

import torch

from p2pnode import checkpoint
from p2pnode.config import Config
from p2pnode.data import DataError
from p2pnode.pipe_protocol import Applied, Message, PeerPayload, Progress, Published
from p2pnode.ps.worker_gradient import decode_gradient, dense
from p2pnode.ps.messages import PsPush
from p2pnode.wire.codec import payload_limit
from p2pnode.wire.payload import NonFiniteError, PayloadError
from p2pnode.worker.process import run_spawned
from p2pnode.worker.public import floating_state
from p2pnode.worker.trainer_loop import TrainerLoop

log = logging.getLogger("p2pnode.worker")


class PsServerWorker(TrainerLoop):
    def __init__(self, conn: Connection, cfg: Config, node_id: str) -> None:
        super().__init__(conn, cfg, node_id)  # the model, its optimizer and the test set, resumed
        model = self.trainer.model
        self.params = dict(model.named_parameters())
        self.buffers = {k: v for k, v in floating_state(model).items() if k not in self.params}
        self.final_evaluated = self.trainer.done

    @torch.no_grad()
    def _apply(self, changes: dict[str, torch.Tensor | None]) -> None:
        t = self.trainer
        for name, param in self.params.items():
            grad = changes.get(name)
            param.grad = grad if grad is not None else torch.zeros_like(param)
        if self.cfg.training.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(t.model.parameters(), self.cfg.training.grad_clip)
        for group in t.optimizer.param_groups:
            group["lr"] = t.lr_now()
        t.optimizer.step()
        for name, buf in self.buffers.items():
            change = changes.get(name)
            if change is not None:
                buf.add_(change)

    def on_push(self, msg: PsPush) -> None:
        t = self.trainer
        try:
            delta = decode_gradient(msg.data, self.spec, payload_limit(self.spec, self.cfg.http.max_payload_bytes))
        except NonFiniteError as exc:
            self.send(Applied(token=msg.token, ok=False, peer=msg.peer, reason="non-finite", detail=str(exc)[:300]))
            return
        except PayloadError as exc:
            self.send(Applied(token=msg.token, ok=False, peer=msg.peer, reason="malformed", detail=str(exc)[:300]))
            return
        state = floating_state(t.model)
        self._apply({name: dense(delta, name, state[name]) for name in self.spec.names})
        t.step += 1
        t.samples += self.cfg.training.batch_size
        loss = delta.header.loss
        if loss >= 0 and math.isfinite(loss):
            t.loss_ema = loss if math.isnan(t.loss_ema) else 0.95 * t.loss_ema + 0.05 * loss
        self.send(Published(version=self.public.version + 1, delta=self.public.publish(t.step, t.loss_ema)))
        staleness = max(0, self.public.version - 1 - delta.header.base_version)
        self.send(Applied(token=msg.token, ok=True, peer=msg.peer, epoch=self.public.epoch,
                          version=self.public.version, weight=1.0, distance=float(staleness)))
        self.send(Progress(step=t.step, samples=t.samples, loss=t.loss_ema if math.isfinite(t.loss_ema) else 0.0,
                           done=t.done, lr=t.lr_now()))
        every = self.cfg.training.eval_every
        if every and t.step % every == 0:
            self.evaluate(self.cfg.training.eval_samples)
        if t.done and not self.final_evaluated:
            self.final_evaluated = True
            self.evaluate(0)

    def on_message(self, msg: Message) -> None:
        if isinstance(msg, PsPush):
            self.on_push(msg)
        elif isinstance(msg, PeerPayload):  # a peer pushing its model: a server takes gradients only
            self.send(Applied(token=msg.token, ok=False, peer=msg.peer, reason="malformed",
                              detail="this node is a parameter server: push gradients to POST /v1/ps/gradient"))

    def loop(self) -> None:
        while self.running:
            if self.conn.poll(0.5):
                self.handle(self.receive())


def run(conn: Connection, cfg_dict: dict[str, Any], node_id: str) -> None:
    """Entry point of the spawned process (``node.role = "ps"``; p2pnode/worker/process.py)."""
    run_spawned(conn, lambda: PsServerWorker(conn, Config.from_dict(cfg_dict), node_id),
                (DataError, checkpoint.CheckpointError, ValueError))
