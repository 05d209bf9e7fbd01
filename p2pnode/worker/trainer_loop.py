"""What the three torch worker processes share (the peer worker, a parameter server's and a
ps-worker's): a ``ShardTrainer`` (model, shard, optimizer, test set) resumed from the node's
checkpoint, the public copy x̂ it serves (``DeltaPublisher``), its hello and its checkpoint.
Said once here so that each process holds only what it does differently."""

from __future__ import annotations

import logging
import secrets
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from p2pnode import checkpoint
from p2pnode.compression.registry import build_sparsifier
from p2pnode.config import Config
from p2pnode.config.adaptive_gossip import publish_spec
from p2pnode.malloc import RELEASE_MODEL_BYTES, release_free_memory
from p2pnode.models import fingerprint
from p2pnode.pipe_protocol import Checkpoint, Evaluated, Hello, Message, PeerPayload, Stop
from p2pnode.wire.replica import replica_folder
from p2pnode.wire.payload import ModelSpec
from p2pnode.worker.process import WorkerLoop
from p2pnode.worker.public import DeltaPublisher, floating_state
from p2pnode.worker.training import ADAPTIVE, ShardTrainer

log = logging.getLogger("p2pnode.worker")


def model_fingerprint(trainer: ShardTrainer) -> str:
    """The architecture fingerprint the trainer's peers would use (the task's, where it has one)."""
    return str(getattr(trainer, "fingerprint", "") or fingerprint(trainer.model))


class TrainerLoop(WorkerLoop):
    """A torch worker process: the trainer, resumed from ``checkpoint.pt`` unless ``resume`` is
    False, and x̂ at the checkpoint's public version."""

    def __init__(self, conn: Connection, cfg: Config, node_id: str, resume: bool = True) -> None:
        super().__init__(conn)
        self.cfg = cfg
        self.node_id = node_id
        self.ckpt_path = Path(cfg.node.state_dir) / checkpoint.CHECKPOINT_NAME
        self.trainer = ShardTrainer(cfg)
        began = time.monotonic()
        state = checkpoint.load(self.ckpt_path) if resume else None
        if state is not None:  # the resume's cost at this model's size (scripts/bench_model_size.py reads it)
            log.info("checkpoint loaded in %.2f s", time.monotonic() - began)
        version = 0
        if state is not None:
            try:
                self.trainer.load_state_dict(state)
                version = int(state.get("version", 0))
            except (RuntimeError, KeyError, TypeError, ValueError) as exc:
                # Another model or config wrote it: restarting would fail the same way, forever.
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise checkpoint.CheckpointError(
                    f"checkpoint {self.ckpt_path} does not fit this model ({first[:200]}); "
                    "move it away to start from a peer's model or from scratch") from exc
        self.resumed = state is not None
        if state is not None:
            self.resume_extra(state)
        model = self.trainer.model
        self.spec = ModelSpec.from_state_dict(floating_state(model), model_fingerprint(self.trainer))
        # what x̂'s publishes keep (compression.publish, or every entry for an adaptive optimizer's
        # gossip: config/adaptive_gossip.py)
        keep = publish_spec(cfg, isinstance(self.trainer.optimizer, ADAPTIVE),
                            sum(p.numel() for p in model.parameters()))
        self.public = DeltaPublisher(model, self.spec, build_sparsifier(keep), node_id,
                                     secrets.token_hex(6), version, cfg.compression.value_dtype,
                                     replica_folder(cfg.node.state_dir))
        #: a big model: what its publishes, peers' payloads and checkpoints freed goes back to the
        #: system after each (p2pnode/malloc.py ``release_free_memory``)
        self.release_freed = 4 * self.spec.numel >= RELEASE_MODEL_BYTES

    def release(self) -> None:
        """After model-sized work: its freed buffers back to the system, for a big model."""
        if self.release_freed:
            release_free_memory()

    def handle(self, msg: Message) -> None:
        super().handle(msg)
        # after model-sized work only (a publish releases on its own): not after the
        # synchronous mode's messages of every step, whose buffers the next step would fault in
        if isinstance(msg, (PeerPayload, Checkpoint, Stop)):
            self.release()

    def resume_extra(self, state: dict[str, Any]) -> None:
        """Read what a subclass adds to the checkpoint (``checkpoint_state``) from the state
        resumed; called once the trainer has its own."""

    def hello_message(self, **extra: Any) -> Hello:
        """Our Hello: the model, x̂ as a snapshot, the counters; ``extra`` fields added."""
        t = self.trainer
        snapshot, public_file, genesis = self.public.hello_fields(t.step, t.loss_ema)
        return Hello(fingerprint=self.spec.fingerprint, epoch=self.public.epoch, version=self.public.version,
                     step=t.step, samples=t.samples, snapshot=snapshot, public_file=public_file, genesis=genesis,
                     resumed=self.resumed, params=sum(p.numel() for p in t.model.parameters()), **extra)

    def hello(self) -> None:
        self.send(self.hello_message())

    def checkpoint_state(self) -> dict[str, Any]:
        """What the checkpoint holds: the trainer's state and x̂'s version."""
        state: dict[str, Any] = self.trainer.state_dict()
        state["version"] = self.public.version
        return state

    def write_checkpoint(self) -> None:
        state = self.checkpoint_state()
        began = time.monotonic()
        checkpoint.save(self.ckpt_path, state)
        log.info("checkpoint at step %d written in %.2f s", self.trainer.step, time.monotonic() - began)

    def checkpoint_step(self) -> int:
        return self.trainer.step

    def evaluate(self, samples: int) -> None:
        """Accuracy and loss on ``samples`` test images (0: all), said to the daemon."""
        acc, loss, n = self.trainer.evaluate(samples)
        self.send(Evaluated(step=self.trainer.step, accuracy=acc, loss=loss, samples=n))
