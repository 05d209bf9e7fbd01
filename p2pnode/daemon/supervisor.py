"""The worker supervisor actor: starts the training worker, restarts it, stops it.

It owns the worker process and routes what the worker says to where it belongs: training
figures to :class:`~p2pnode.daemon.state.TrainingState` (and the :class:`StepClock` reading
them), published deltas and hello snapshots to the :class:`ModelSource`, answers to the pipe
client. A worker that dies is restarted from the last checkpoint with a back-off; one that
reports it cannot work at all (missing data, a checkpoint of another model) stops the node.

Which worker runs is the mode's choice (``Mode.worker_module``, p2pnode/daemon/mode.py); for a
peer ``training.worker`` (``p2pnode.worker.IMPLEMENTATIONS``): the torch trainer, or a numpy
stand-in for tests that need real nodes but no training. Both speak ``p2pnode/pipe_protocol.py``
over the same pipe, so the daemon cannot tell them apart; the daemon only names the module,
which is imported in the spawned process.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing as mp
import os
import time
from collections.abc import Awaitable, Callable

from p2pnode import worker as worker_process
from p2pnode.config import CompressionConfig, Config, adaptive_gossip
from p2pnode.config.mode_rule import sync_of
from p2pnode.daemon.metrics import NodeMetrics
from p2pnode.daemon.pipe import WorkerPipe
from p2pnode.daemon.state import ModelSource, StepClock, TrainingState
from p2pnode.pipe_protocol import (
    Applied,
    Begin,
    Checkpointed,
    Evaluated,
    Failed,
    Hello,
    Message,
    Progress,
    Published,
    Stop,
    joined,
)
from p2pnode.wire.codec import decode
from p2pnode.wire.payload import ModelSpec, Snapshot
from p2pnode.wire.public_file import PublicReader
from p2pnode.wire.served import ServedModel

log = logging.getLogger("p2pnode.supervisor")

WORKER_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(64 << 20), "MALLOC_TRIM_THRESHOLD_": str(256 << 20)}


class WorkerFailed(RuntimeError):
    """The worker cannot train at all; restarting would not help."""


#: how much lower the worker's CPU priority is than the daemon's (nice steps), once it trains.
#: The daemon's event loop answers pings, health checks and fetches within 100 ms only if it
#: gets a core when it wakes; a worker computing flat out (a 124M model's top-k publish burns a
#: core for seconds) otherwise keeps it in the run queue. On a machine of its own the worker
#: loses nothing: the daemon sleeps nearly all the time. The worker starts (imports torch,
#: builds its model) at the daemon's priority, so that its start-up (35 s for a torch worker on a
#: loaded 2-core machine) is not slowed further.
WORKER_NICE = 5


def lower_priority(pid: int) -> None:
    """Put every thread of process ``pid`` ``WORKER_NICE`` steps below the daemon (on Linux a
    niceness is a thread's; threads created later inherit their creator's). Raising a niceness
    needs no privilege; a failure only leaves the worker's equal to the daemon's."""
    want = min(19, os.getpriority(os.PRIO_PROCESS, 0) + WORKER_NICE)
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        tids = [pid]
    for tid in tids:
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) < want:
                os.setpriority(os.PRIO_PROCESS, tid, want)
        except OSError as exc:
            log.debug("worker thread %d's priority left as it was: %s", tid, exc)


class WorkerSupervisor:
    def __init__(self, cfg: Config, node_id: str, metrics: NodeMetrics, worker_module: str = "") -> None:
        self.cfg = cfg
        #: the module the spawned process runs ("": the peer worker ``training.worker`` names)
        self.worker_module = worker_module or worker_process.IMPLEMENTATIONS[cfg.training.worker]
        self.node_id = node_id
        self.metrics = metrics
        self.state = TrainingState()
        self.clock = StepClock(self.state)
        self.model = ModelSource()
        self.pipe = WorkerPipe(metrics)
        self._proc: mp.process.BaseProcess | None = None
        self._stopping = False
        self._consuming = False  # run() is reading the worker's messages
        #: the current worker's end of the pipe is closed (it exited, or is exiting): nothing
        #: more can be said to it, only its exit awaited
        self._pipe_closed = False
        #: the current worker answered a Stop: a second stop() (the node's last cleanup, after the
        #: stop that wrote the final checkpoint) only waits for its exit
        self._stop_answered = False
        self._advised_batchnorm = False  # the BatchNorm advice is logged once a daemon life
        #: where messages this supervisor does not route go (a mode's own: Mode.on_message); None: dropped
        self.on_message: Callable[[Message], Awaitable[None]] | None = None
        #: training.min_peers was met (or waited out): every worker life is told Begin
        self.begun = False

    @property
    def worker_pid(self) -> int | None:
        """The current worker process (alive or not yet reaped), None before the first start."""
        return self._proc.pid if self._proc is not None else None

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
        self._proc = ctx.Process(target=worker_process.run,
                                 args=(self.worker_module, self.cfg.training.worker, child, self.cfg.to_dict(),
                                       self.node_id),
                                 name="p2pnode-worker", daemon=True)
        self._proc.start()
        child.close()
        self.pipe.attach(parent)

    async def run(self) -> None:
        backoff = 1.0
        while True:
            self._start_worker()
            started = time.monotonic()
            self._pipe_closed = self._stop_answered = False
            self._consuming = True
            try:
                while (msg := await self.pipe.receive()) is not None:
                    try:
                        await self._dispatch(msg)
                    except ConnectionError as exc:
                        # Answering it, the pipe broke: the worker is gone (killed, or it took a
                        # SIGTERM meant for a node stopping as it starts). Its end is handled
                        # below like any other; raised, it would end the whole node.
                        log.warning("worker pipe closed while answering %s: %s", type(msg).__name__, exc)
                        break
            finally:
                self._consuming = False
                self._pipe_closed = True
                self.state.worker_alive = False
                self.pipe.fail_pending(ConnectionError("worker exited"))
            proc = self._proc
            assert proc is not None
            await asyncio.to_thread(proc.join, 5.0)
            if proc.is_alive():  # closed its pipe but did not exit: it will not be back
                proc.kill()
                await asyncio.to_thread(proc.join, 2.0)
            await self.pipe.detach()
            if self._stopping:
                return
            log.error("training worker exited (code %s); restarting from the last checkpoint", proc.exitcode)
            self.state.worker_restarts += 1
            self.metrics.worker_restarts.inc()
            backoff = 1.0 if time.monotonic() - started > 60 else min(30.0, backoff * 2)
            await asyncio.sleep(backoff)

    async def _dispatch(self, msg: Message) -> None:
        s = self.state
        if isinstance(msg, Progress):
            self.metrics.steps.inc(max(0, msg.step - s.step))
            self.metrics.samples.inc(max(0, msg.samples - s.samples))
            self.metrics.loss.set(msg.loss)
            now = time.monotonic()
            if s.first_step_at is None:
                s.first_step_at = now
            if msg.done and s.done_at is None:
                s.done_at = now
            self.metrics.note_nonfinite(max(0, msg.nonfinite - s.nonfinite))  # and the diverging gauge
            self.metrics.lr.set(msg.lr)
            s.step, s.samples, s.loss, s.done, s.lr = msg.step, msg.samples, msg.loss, msg.done, msg.lr
            s.nonfinite, s.batch_share = msg.nonfinite, msg.batch_share
            await self.clock.tick()
        elif isinstance(msg, Published):
            await self._on_published(msg)
        elif isinstance(msg, Hello):
            await self._on_hello(msg)
        elif isinstance(msg, Evaluated):
            s.accuracy, s.test_loss, s.eval_step, s.eval_samples = msg.accuracy, msg.loss, msg.step, msg.samples
            s.eval_consensus = msg.consensus
            if msg.kept_own and not s.finish_kept_own:
                s.finish_kept_own = True
                self.metrics.finish_refused.inc()
                log.warning("consensus finish: the agreed model was worse on the held-out split than ours before "
                            "the finish; this node keeps its own model (the figures below are of it)")
            s.metrics = {k: float(v) for k, v in msg.metrics.items()
                         if isinstance(v, (int, float)) and abs(v) < float("inf")}  # finite: JSON has no NaN
            self.metrics.accuracy.set(msg.accuracy)
            for name, value in s.metrics.items():
                self.metrics.test_metric.labels(name[:64]).set(value)
            named = "  ".join(f"{k} {v:.4g}" for k, v in sorted(s.metrics.items()) if k not in ("accuracy", "loss"))
            log.info("step %d: test accuracy %.4f on %d images%s%s", msg.step, msg.accuracy, msg.samples,
                     f" ({named})" if named else "", ", the model agreed on (consensus finish)" if msg.consensus else "")
        elif isinstance(msg, Checkpointed):
            if msg.ok:
                s.last_checkpoint_step, s.last_checkpoint_at = msg.step, time.time()
                self.metrics.checkpoints.inc()
            else:
                log.error("checkpoint failed: %s", msg.detail)
                self.metrics.checkpoint_failures.inc()
            self.pipe.answer(msg)
        elif isinstance(msg, Applied):
            self.pipe.answer(msg)
        elif isinstance(msg, Failed):
            raise WorkerFailed(msg.detail)
        elif self.on_message is not None:
            await self.on_message(msg)

    async def _on_published(self, msg: Published) -> None:
        served = self.model.served
        assert served is not None  # a worker says hello before it publishes
        delta = joined(msg.delta)  # one buffer as it came through the pipe
        try:
            await asyncio.to_thread(served.publish, delta)
        except ValueError as exc:  # PayloadError: our mirror of x_hat and the worker's disagree
            # Should not happen; if it does, a restarted worker says hello with a fresh
            # snapshot and a new epoch, and peers resynchronise from that.
            log.error("worker published a delta that does not fit (%s); restarting it", exc)
            if self._proc is not None:
                self._proc.kill()
            return
        self.state.published_version = msg.version
        self.metrics.published_version.set(msg.version)
        self.metrics.published_bytes.inc(memoryview(delta).nbytes)
        self.model.changed()

    def _advise_batchnorm(self, layers: int) -> None:
        """Once a daemon life: a BatchNorm model in gossip mode under the default sparse copies
        learned slower than one machine (docs/BENCHMARKS.md, "The same on real images": after
        180 steps 0.24-0.36 against 0.66 on Fashion-MNIST, after 540 0.765 against 0.775;
        denser copies 0.43-0.62 and 0.81, the synchronous mode 0.73 and 0.82), so the operator
        is told what measured better, as for skewed labels."""
        cfg = self.cfg
        if (not layers or self._advised_batchnorm or sync_of(cfg) != "none" or cfg.node.role != "peer"
                or cfg.compression.publish != CompressionConfig().publish):  # a choice made: theirs
            return
        self._advised_batchnorm = True
        log.warning("the model has %d BatchNorm layers: under gossip's default sparse copies such a model "
                    "learned slower than on one machine (far slower in short runs); denser copies "
                    "(compression.publish = \"topk:density=0.3\") or, among machines you run, exchange.sync = "
                    "\"powersgd\" learned it faster and ended higher (docs/TASKS.md)", layers)

    async def _on_hello(self, msg: Hello) -> None:
        s = self.state
        served = await asyncio.to_thread(self._served_model, msg)
        self.model.served = served
        self.model.changed()
        s.step, s.samples, s.fingerprint, s.epoch = msg.step, msg.samples, msg.fingerprint, msg.epoch
        s.resumed, s.params, s.published_version, s.worker_alive = msg.resumed, msg.params, msg.version, True
        if self._proc is not None and self._proc.pid is not None:
            lower_priority(self._proc.pid)  # it has started: it trains below the daemon
        s.classes = list(msg.classes)
        s.batchnorm_layers = msg.batchnorm
        s.optimizer, s.adaptive = msg.optimizer, msg.adaptive
        if (line := adaptive_gossip.said(self.cfg, msg.adaptive, msg.params)) and not msg.resumed:
            log.info("%s", line)
        self._advise_batchnorm(msg.batchnorm)
        self.metrics.published_version.set(msg.version)
        await self.clock.tick()  # a new life: the exchange forgets its replica versions
        log.info("worker ready: %d parameters, step %d%s, public version %d, epoch %s", msg.params, msg.step,
                 " (resumed from checkpoint)" if msg.resumed else "", msg.version, msg.epoch)
        self.clock.ready.set()
        if self.begun:
            await self.pipe.send(Begin())

    def _served_model(self, msg: Hello) -> ServedModel:
        """What serves the new worker's x̂ (in a thread): a mirror reset from its snapshot, or
        for a big model its own x̂ read from the file it keeps it in (no copy here)."""
        reader = PublicReader(msg.public_file) if msg.public_file else None
        if reader is not None:
            spec = reader.spec
        else:
            snap = decode(msg.snapshot, None, len(msg.snapshot))
            assert isinstance(snap, Snapshot)
            spec = ModelSpec(snap.header.fingerprint, list(snap.header.specs))
        # snapshots kept up to 1 s across publishes: a flood of ?since=0 costs one encoding a second
        served = ServedModel(spec, self.node_id, msg.epoch, log_size=self.cfg.compression.log_size,
                             snapshot_max_age=1.0)
        if reader is not None:
            served.attach(reader, msg.epoch, msg.version, msg.genesis)
        else:
            served.reset(msg.snapshot)
        return served

    async def begin(self) -> None:
        """Let training start (training.min_peers met): this worker now, every later one at hello."""
        self.begun = True
        if self.pipe.attached and self.state.worker_alive:
            await self.pipe.send(Begin())

    async def stop(self, checkpoint: bool = True, timeout: float = 6.0) -> None:
        """Ask the worker to write a final checkpoint and exit; kill it if it does not."""
        self._stopping = True
        proc = self._proc
        if proc is None:
            return
        grace = 2.0  # for the worker's exit after its reply
        # A worker that answered a Stop, or whose pipe has closed, is exiting: writing to it
        # would fail with a broken pipe and say "did not stop cleanly" of a clean stop (seen when
        # the node's last cleanup stopped a worker that had just answered the first stop).
        if self.pipe.attached and proc.is_alive() and not (self._stop_answered or self._pipe_closed):
            try:
                stop = Stop(checkpoint=checkpoint, token=self.pipe.token())
                if self._consuming:
                    await self.pipe.request(stop, timeout)
                    self._stop_answered = True
                else:  # run() was cancelled: nobody reads the reply, the worker's exit is the answer
                    async with asyncio.timeout(timeout):  # not wait_for: it can drop a cancellation (3.11)
                        await self.pipe.send(stop)
                    grace = timeout
            except (TimeoutError, ConnectionError) as exc:
                log.warning("worker did not stop cleanly (%r)%s", exc,
                            "; the final checkpoint was not written" if checkpoint else "")
        await asyncio.to_thread(proc.join, grace)
        if proc.is_alive():
            proc.kill()
            await asyncio.to_thread(proc.join, 2.0)
