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
import secrets
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch

from p2pnode import checkpoint
from p2pnode.compression.registry import build_sparsifier
from p2pnode.config import Config
from p2pnode.data import DataError
from p2pnode.pipe_protocol import (
    Applied,
    Checkpoint,
    Checkpointed,
    Evaluated,
    Hello,
    Message,
    PeerPayload,
    Progress,
    Published,
    Stop,
    receive,
    send,
)
from p2pnode.ps.gradient import decode_gradient, dense
from p2pnode.ps.messages import PsPush
from p2pnode.ps.worker_loop import model_fingerprint
from p2pnode.wire.codec import payload_limit
from p2pnode.wire.payload import ModelSpec, NonFiniteError, PayloadError
from p2pnode.worker.process import run_spawned
from p2pnode.worker.public import DeltaPublisher, floating_state
from p2pnode.worker.training import ShardTrainer

log = logging.getLogger("p2pnode.worker")


class PsServerWorker:
    def __init__(self, conn: Connection, cfg: Config, node_id: str) -> None:
        self.conn = conn
        self.cfg = cfg
        self.ckpt_path = Path(cfg.node.state_dir) / checkpoint.CHECKPOINT_NAME
        self.trainer = ShardTrainer(cfg)  # the model, its optimizer and the test set
        state = checkpoint.load(self.ckpt_path)
        version = 0
        if state is not None:
            try:
                self.trainer.load_state_dict(state)
                version = int(state.get("version", 0))
            except (RuntimeError, KeyError, TypeError, ValueError) as exc:
                raise checkpoint.CheckpointError(f"checkpoint {self.ckpt_path} does not fit this model: {exc}") from exc
        self.resumed = state is not None
        model = self.trainer.model
        self.spec = ModelSpec.from_state_dict(floating_state(model), model_fingerprint(self.trainer))
        self.public = DeltaPublisher(model, self.spec, build_sparsifier(cfg.compression.publish), node_id,
                                     secrets.token_hex(6), version, cfg.compression.value_dtype)
        self.params = dict(model.named_parameters())
        self.buffers = {k: v for k, v in floating_state(model).items() if k not in self.params}
        self.running = True
        self.final_evaluated = self.trainer.done

    def send(self, msg: Message) -> None:
        send(self.conn, msg)

    def hello(self) -> None:
        t = self.trainer
        self.send(Hello(fingerprint=self.spec.fingerprint, epoch=self.public.epoch, version=self.public.version,
                        step=t.step, samples=t.samples, snapshot=self.public.snapshot(t.step, t.loss_ema),
                        resumed=self.resumed, params=sum(p.numel() for p in t.model.parameters())))

    def save_checkpoint(self, token: int) -> None:
        state: dict[str, Any] = self.trainer.state_dict()
        state["version"] = self.public.version
        try:
            checkpoint.save(self.ckpt_path, state)
            self.send(Checkpointed(token=token, step=self.trainer.step, path=str(self.ckpt_path)))
        except OSError as exc:
            self.send(Checkpointed(token=token, step=self.trainer.step, path=str(self.ckpt_path), ok=False,
                                   detail=str(exc)))

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

    def evaluate(self, samples: int) -> None:
        acc, loss, n = self.trainer.evaluate(samples)
        self.send(Evaluated(step=self.trainer.step, accuracy=acc, loss=loss, samples=n))

    def handle(self, msg: Message) -> None:
        if isinstance(msg, PsPush):
            self.on_push(msg)
        elif isinstance(msg, PeerPayload):  # a peer pushing its model: a server takes gradients only
            self.send(Applied(token=msg.token, ok=False, peer=msg.peer, reason="malformed",
                              detail="this node is a parameter server: push gradients to POST /v1/ps/gradient"))
        elif isinstance(msg, Checkpoint):
            self.save_checkpoint(msg.token)
        elif isinstance(msg, Stop):
            if msg.checkpoint:
                self.save_checkpoint(msg.token)
            else:
                self.send(Checkpointed(token=msg.token, step=self.trainer.step, path="", ok=False,
                                       detail="not asked for"))
            self.running = False

    def loop(self) -> None:
        while self.running:
            if self.conn.poll(0.5):
                self.handle(receive(self.conn))


def run(conn: Connection, cfg_dict: dict[str, Any], node_id: str) -> None:
    """Entry point of the spawned process (``node.role = "ps"``; p2pnode/worker/process.py)."""
    run_spawned(conn, lambda: PsServerWorker(conn, Config.from_dict(cfg_dict), node_id),
                (DataError, checkpoint.CheckpointError, ValueError))
