"""The trainer actor: supervises the training worker process and relays its messages.

It owns the worker, the pipe, the training figures shown in status, and this node's public
model (the publisher serving ``GET /v1/model``). A worker that dies is restarted from the last
checkpoint with a back-off; one that reports it cannot work at all (missing data) stops the node.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing as mp
import os
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from p2pnode import pipe_protocol as m
from p2pnode.config import Config
from p2pnode.daemon.metrics import NodeMetrics
from p2pnode.wire.codec import ModelSpec, Snapshot, decode
from p2pnode.wire.served import ServedModel
from p2pnode.worker.main import run as worker_main

log = logging.getLogger("p2pnode.trainer")


WORKER_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(64 << 20), "MALLOC_TRIM_THRESHOLD_": str(256 << 20)}


class WorkerFailed(RuntimeError):
    """The worker cannot train at all; restarting would not help."""


@dataclass
class TrainingState:
    """What status shows about training; written only by the trainer actor."""

    step: int = 0
    samples: int = 0
    loss: float = float("nan")
    lr: float = 0.0
    done: bool = False
    accuracy: float | None = None
    test_loss: float | None = None
    eval_step: int = 0
    eval_samples: int = 0
    params: int = 0
    fingerprint: str = ""
    epoch: str = ""
    resumed: bool = False
    worker_restarts: int = 0
    worker_alive: bool = False
    published_version: int = 0
    last_checkpoint_step: int | None = None
    last_checkpoint_at: float | None = None
    started_at: float = field(default_factory=time.monotonic)
    #: monotonic times of the first step this life and of reaching training.max_samples
    first_step_at: float | None = None
    done_at: float | None = None

    @property
    def train_seconds(self) -> float | None:
        """Wall time spent training (first step to done, or to now), start-up excluded."""
        if self.first_step_at is None:
            return None
        return (self.done_at or time.monotonic()) - self.first_step_at

    def to_json(self) -> dict[str, Any]:
        hidden = ("started_at", "last_checkpoint_at", "first_step_at", "done_at")
        out = {k: v for k, v in self.__dict__.items() if k not in hidden}
        out["loss"] = None if self.loss != self.loss else self.loss
        out["train_seconds"] = None if self.train_seconds is None else round(self.train_seconds, 3)
        return out


class Trainer:
    def __init__(self, cfg: Config, node_id: str, metrics: NodeMetrics) -> None:
        self.cfg = cfg
        self.node_id = node_id
        self.metrics = metrics
        self.state = TrainingState()
        self.publisher: ServedModel | None = None
        self.spec: ModelSpec | None = None
        self.ready = asyncio.Event()  # set once the first worker said hello
        #: notified whenever the public model changes (a publish, or a new worker's snapshot)
        self.published = asyncio.Condition()
        self.step_changed = asyncio.Condition()
        self._tokens = itertools.count(1)
        self._pending: dict[int, asyncio.Future[m.Message]] = {}
        self._proc: mp.process.BaseProcess | None = None
        self._conn: Connection | None = None
        self._reader: threading.Thread | None = None
        self._inbox: asyncio.Queue[m.Message | None] = asyncio.Queue()
        self._send_lock = asyncio.Lock()
        self._stopping = False
        self._consuming = False  # run() is reading the worker's replies

    # --- talking to the worker ------------------------------------------------------------

    async def send(self, msg: m.Message) -> None:
        data = m.encode(msg)
        # The lock serialises writers (big payloads: the pipe may block until the worker reads)
        # and keeps the pipe from being closed under a write in progress (see run()).
        async with self._send_lock:
            conn = self._conn
            if conn is None:
                raise ConnectionError("no worker")
            write = asyncio.ensure_future(asyncio.to_thread(conn.send_bytes, data))
            try:
                await asyncio.shield(write)
            except asyncio.CancelledError:
                # The thread writes on regardless; giving up the lock now would let the next
                # message interleave with this one's bytes. Hold it until the write ends (a
                # hung worker is killed by stop(), whose own wait for the lock times out).
                while not write.done():
                    try:
                        await asyncio.wait([write])
                    except asyncio.CancelledError:
                        continue  # the first cancellation is re-raised below
                if not write.cancelled():
                    write.exception()  # seen: the caller hears of the cancellation instead
                raise
            except (OSError, ValueError) as exc:
                raise ConnectionError(f"worker pipe: {exc!r}") from exc

    async def request(self, msg: m.PeerPayload | m.Checkpoint | m.Stop, timeout: float) -> m.Message:
        """Send a message carrying a token and wait for the worker's answer to it."""
        fut: asyncio.Future[m.Message] = asyncio.get_running_loop().create_future()
        self._pending[msg.token] = fut
        try:
            async with asyncio.timeout(timeout):  # waiting for the pipe counts too
                await self.send(msg)
                return await fut
        finally:
            self._pending.pop(msg.token, None)
            if not fut.done():
                fut.cancel()
            elif not fut.cancelled():
                fut.exception()  # failed while we were still sending: already reported by send

    def token(self) -> int:
        return next(self._tokens)

    async def deliver(self, peer: str, data: bytes, mode: m.PeerMode = m.AVERAGE, timeout: float = 30.0) -> m.Applied:
        reply = await self.request(m.PeerPayload(token=self.token(), peer=peer, data=data, mode=mode), timeout)
        assert isinstance(reply, m.Applied)
        if not reply.ok:
            self.metrics.rejected.labels(reply.reason).inc()
        return reply

    async def checkpoint(self, timeout: float = 30.0) -> m.Checkpointed:
        reply = await self.request(m.Checkpoint(token=self.token()), timeout)
        assert isinstance(reply, m.Checkpointed)
        return reply

    def _notify_published(self) -> None:
        async def notify() -> None:
            async with self.published:
                self.published.notify_all()

        asyncio.get_running_loop().create_task(notify())

    async def wait_published(self, version: int, epoch: str, timeout: float) -> None:
        """Wait until the public model moves past (epoch, version), at most ``timeout`` s."""

        def moved() -> bool:
            p = self.publisher
            return p is None or p.version != version or p.epoch != epoch

        try:
            async with asyncio.timeout(timeout):
                async with self.published:
                    await self.published.wait_for(moved)
        except TimeoutError:
            pass

    async def wait_step(self, after: int) -> int:
        """Wait until the worker has taken a step past ``after``, training is over, or a new
        worker said hello (it resumes from a checkpoint, maybe at a lower step)."""
        epoch = self.state.epoch
        async with self.step_changed:
            await self.step_changed.wait_for(
                lambda: self.state.step > after or self.state.done or self.state.epoch != epoch)
        return self.state.step

    # --- the actor ------------------------------------------------------------------------

    def _start_worker(self) -> None:
        # glibc's default malloc returns the big per-step tensor buffers to the kernel and
        # faults them back in on the next step: thousands of page faults a step, 5-8 ms of a
        # ~19 ms step on the small CNN (scripts/bench_overhead.py). Keeping them mapped costs
        # nothing; the variables are read when the spawned interpreter starts.
        for key, value in WORKER_MALLOC_ENV.items():
            os.environ.setdefault(key, value)
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe(duplex=True)
        self._proc = ctx.Process(target=worker_main, args=(child, self.cfg.to_dict(), self.node_id),
                                 name="p2pnode-worker", daemon=True)
        self._proc.start()
        child.close()
        self._conn = parent
        loop = asyncio.get_running_loop()
        self._reader = threading.Thread(target=self._read_pipe, args=(parent, loop), daemon=True,
                                        name="p2pnode-worker-pipe")
        self._reader.start()

    def _read_pipe(self, conn: Connection, loop: asyncio.AbstractEventLoop) -> None:
        """Blocking reads in a thread; every message is handed to the loop in order."""
        while True:
            try:
                msg: m.Message | None = m.decode(conn.recv_bytes())
            except (EOFError, OSError):
                msg = None
            except ValueError as exc:
                log.error("worker sent an undecodable message: %s", exc)
                continue
            try:
                loop.call_soon_threadsafe(self._inbox.put_nowait, msg)
            except RuntimeError:
                return  # the loop is closed
            if msg is None:
                return

    async def run(self) -> None:
        backoff = 1.0
        while True:
            self._start_worker()
            started = time.monotonic()
            self._consuming = True
            try:
                await self._consume()
            finally:
                self._consuming = False
                self.state.worker_alive = False
                for fut in self._pending.values():
                    if not fut.done():
                        fut.set_exception(ConnectionError("worker exited"))
            proc = self._proc
            assert proc is not None
            await asyncio.to_thread(proc.join, 5.0)
            if proc.is_alive():  # closed its pipe but did not exit: it will not be back
                proc.kill()
                await asyncio.to_thread(proc.join, 2.0)
            # The worker is gone, so a read or write still in progress ends (EOF, EPIPE); the
            # pipe is closed only then, never under a thread still using its descriptor.
            if self._reader is not None:
                await asyncio.to_thread(self._reader.join, 5.0)
            async with self._send_lock:
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None
            if self._stopping:
                return
            log.error("training worker exited (code %s); restarting from the last checkpoint", proc.exitcode)
            self.state.worker_restarts += 1
            self.metrics.worker_restarts.inc()
            backoff = 1.0 if time.monotonic() - started > 60 else min(30.0, backoff * 2)
            await asyncio.sleep(backoff)

    async def _consume(self) -> None:
        while True:
            msg = await self._inbox.get()
            if msg is None:
                return
            await self._dispatch(msg)

    async def _dispatch(self, msg: m.Message) -> None:
        s = self.state
        if isinstance(msg, m.Progress):
            self.metrics.steps.inc(max(0, msg.step - s.step))
            self.metrics.samples.inc(max(0, msg.samples - s.samples))
            self.metrics.loss.set(msg.loss)
            now = time.monotonic()
            if s.first_step_at is None:
                s.first_step_at = now
            if msg.done and s.done_at is None:
                s.done_at = now
            s.step, s.samples, s.loss, s.done, s.lr = msg.step, msg.samples, msg.loss, msg.done, msg.lr
            async with self.step_changed:
                self.step_changed.notify_all()
        elif isinstance(msg, m.Published):
            assert self.publisher is not None
            try:
                await asyncio.to_thread(self.publisher.publish, msg.delta)
            except ValueError as exc:  # PayloadError: our mirror of x_hat and the worker's disagree
                # Should not happen; if it does, a restarted worker says hello with a fresh
                # snapshot and a new epoch, and peers resynchronise from that.
                log.error("worker published a delta that does not fit (%s); restarting it", exc)
                if self._proc is not None:
                    self._proc.kill()
                return
            s.published_version = msg.version
            self.metrics.published_version.set(msg.version)
            self.metrics.published_bytes.inc(len(msg.delta))
            self._notify_published()
        elif isinstance(msg, m.Hello):
            await self._on_hello(msg)
        elif isinstance(msg, m.Evaluated):
            s.accuracy, s.test_loss, s.eval_step, s.eval_samples = msg.accuracy, msg.loss, msg.step, msg.samples
            self.metrics.accuracy.set(msg.accuracy)
            log.info("step %d: test accuracy %.4f on %d images", msg.step, msg.accuracy, msg.samples)
        elif isinstance(msg, (m.Applied, m.Checkpointed)):
            if isinstance(msg, m.Checkpointed):
                if msg.ok:
                    s.last_checkpoint_step, s.last_checkpoint_at = msg.step, time.time()
                    self.metrics.checkpoints.inc()
                else:
                    log.error("checkpoint failed: %s", msg.detail)
                    self.metrics.checkpoint_failures.inc()
            fut = self._pending.get(msg.token)
            if fut is not None and not fut.done():
                fut.set_result(msg)
        elif isinstance(msg, m.Failed):
            raise WorkerFailed(msg.detail)

    async def _on_hello(self, msg: m.Hello) -> None:
        s = self.state
        snap = await asyncio.to_thread(decode, msg.snapshot, None, len(msg.snapshot))
        assert isinstance(snap, Snapshot)
        self.spec = ModelSpec(snap.header.fingerprint, list(snap.header.specs))
        publisher = ServedModel(self.spec, self.node_id, msg.epoch, log_size=self.cfg.compression.log_size)
        await asyncio.to_thread(publisher.reset, msg.snapshot)
        self.publisher = publisher
        self._notify_published()
        s.step, s.samples, s.fingerprint, s.epoch = msg.step, msg.samples, msg.fingerprint, msg.epoch
        s.resumed, s.params, s.published_version, s.worker_alive = msg.resumed, msg.params, msg.version, True
        self.metrics.published_version.set(msg.version)
        async with self.step_changed:
            self.step_changed.notify_all()
        log.info("worker ready: %d parameters, step %d%s, public version %d, epoch %s", msg.params, msg.step,
                 " (resumed from checkpoint)" if msg.resumed else "", msg.version, msg.epoch)
        self.ready.set()

    async def stop(self, checkpoint: bool = True, timeout: float = 6.0) -> None:
        """Ask the worker to write a final checkpoint and exit; kill it if it does not."""
        self._stopping = True
        proc = self._proc
        if proc is None:
            return
        grace = 2.0  # for the worker's exit after its reply
        if self._conn is not None and proc.is_alive():
            try:
                stop = m.Stop(checkpoint=checkpoint, token=self.token())
                if self._consuming:
                    await self.request(stop, timeout)
                else:  # run() was cancelled: nobody reads the reply, the worker's exit is the answer
                    await asyncio.wait_for(self.send(stop), timeout)
                    grace = timeout
            except (TimeoutError, ConnectionError) as exc:
                log.warning("worker did not stop cleanly (%r)%s", exc,
                            "; the final checkpoint was not written" if checkpoint else "")
        await asyncio.to_thread(proc.join, grace)
        if proc.is_alive():
            proc.kill()
            await asyncio.to_thread(proc.join, 2.0)
