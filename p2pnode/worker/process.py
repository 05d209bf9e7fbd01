"""The life of a spawned training process, the same for every kind the daemon starts (the torch
worker, the stub, a parameter server's and a ps-worker's loop): torch-free, so the stub stays so.

:class:`WorkerLoop` is what every such process does alike: its end of the pipe, the daemon's
``Checkpoint`` and ``Stop`` answered with a ``Checkpointed``, said once here; each kind writes its
own checkpoint (``write_checkpoint``) and handles its own messages (``on_message``).
:class:`PeerLoop` adds what a peer's worker answers alike, the torch one and the stub: a peer's
payload, the start (``Begin``), a pace limit (``Hold``), an evaluation and a publish asked for.

The daemon decides when we stop (Ctrl-C, `timeout` and systemd may signal the whole process
group), so SIGINT and SIGTERM are ignored; if the daemon itself dies, the pipe closes and we exit
on EOF. A process that cannot be built says why in one ``Failed`` message. At the end every answer
is in the pipe and the final checkpoint is fsynced, so the interpreter's teardown is skipped: with
torch loaded it takes 1-3 s on a busy machine, all of it inside the daemon's 10 s stop budget
(and systemd's TimeoutStopSec).
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Protocol

from p2pnode.pipe_protocol import (
    Begin,
    Checkpoint,
    Checkpointed,
    Evaluate,
    Failed,
    Hold,
    Message,
    PeerPayload,
    PublishNow,
    Stop,
    encode,
    receive,
    send,
)


class Spawned(Protocol):
    def hello(self) -> None: ...

    def loop(self) -> None: ...


def run_spawned(conn: Connection, make: Callable[[], Spawned], failures: tuple[type[Exception], ...]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        process = make()
    except failures as exc:
        conn.send_bytes(encode(Failed(detail=str(exc))))
        return
    try:
        process.hello()
        process.loop()
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the daemon is gone: nothing left to do
    logging.shutdown()
    os._exit(0)


class WorkerLoop:
    """The pipe and the checkpoint of a worker process. A subclass says where its checkpoint
    goes (``ckpt_path``), writes it (``write_checkpoint``, OSError when it cannot), says its step
    (``checkpoint_step``) and handles every other message (``on_message``)."""

    ckpt_path: Path

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        #: False once the daemon said Stop: the loop ends
        self.running = True

    def send(self, msg: Message) -> None:
        send(self.conn, msg)

    def receive(self) -> Message:
        return receive(self.conn)

    def write_checkpoint(self) -> None:
        raise NotImplementedError

    def checkpoint_step(self) -> int:
        raise NotImplementedError

    def on_message(self, msg: Message) -> None:
        """A message other than Checkpoint and Stop (this base ignores it)."""

    def save_checkpoint(self, token: int) -> None:
        """Write the checkpoint and answer ``token`` with where, or why it could not be written."""
        try:
            self.write_checkpoint()
            self.send(Checkpointed(token=token, step=self.checkpoint_step(), path=str(self.ckpt_path)))
        except OSError as exc:
            self.send(Checkpointed(token=token, step=self.checkpoint_step(), path=str(self.ckpt_path), ok=False,
                                   detail=str(exc)))

    def handle(self, msg: Message) -> None:
        if isinstance(msg, Checkpoint):
            self.save_checkpoint(msg.token)
        elif isinstance(msg, Stop):
            if msg.checkpoint:
                self.save_checkpoint(msg.token)
            else:  # still answer, so the daemon need not wait out a timeout
                self.send(Checkpointed(token=msg.token, step=self.checkpoint_step(), path="", ok=False,
                                       detail="not asked for"))
            self.running = False
        else:
            self.on_message(msg)


class PeerLoop(WorkerLoop):
    """A peer's worker (gossip's and the synchronous mode's; torch or stub). A subclass says its
    step (``checkpoint_step``) and whether training is over (``finished``), and does the work:
    ``on_peer``, ``evaluate_all``, ``publish_asked``; every other message goes to ``on_other``."""

    #: training.min_peers / start_settle: a fresh worker takes no step before the daemon's Begin
    waiting: bool = False
    #: exchange.max_lead: no step at or beyond this one (-1: none), the daemon's Hold
    limit: int = -1
    #: the step of the last publish: compression.publish_on = "fetch" publishes once a step at most
    published_step: int = 0

    def finished(self) -> bool:
        raise NotImplementedError

    def on_peer(self, msg: PeerPayload) -> None:
        raise NotImplementedError

    def evaluate_all(self, consensus: bool) -> None:
        """The daemon's Evaluate: the whole test set (``consensus``: the model agreed on)."""
        raise NotImplementedError

    def publish_asked(self) -> None:
        """compression.publish_on = "fetch": a member's fetch asks for what changed."""
        raise NotImplementedError

    def on_other(self, msg: Message) -> None:
        """A message of a mode's own (this base ignores it)."""

    def on_message(self, msg: Message) -> None:
        if isinstance(msg, PeerPayload):
            self.on_peer(msg)
        elif isinstance(msg, Begin):
            self.waiting = False
        elif isinstance(msg, Evaluate):
            self.evaluate_all(msg.consensus)
        elif isinstance(msg, Hold):
            self.limit = msg.limit
        elif isinstance(msg, PublishNow):  # once a step at most
            if not self.finished() and self.checkpoint_step() > self.published_step:
                self.publish_asked()
        else:
            self.on_other(msg)

    def held(self) -> bool:
        """exchange.max_lead: the daemon's Hold says we are too far ahead of our peers."""
        return 0 <= self.limit <= self.checkpoint_step() and not self.finished()
