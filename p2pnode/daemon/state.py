"""What the other actors may read of the training worker: narrow views, written only by the
supervisor (``supervisor.py``).

* :class:`TrainingState`: the figures ``/v1/status`` shows.
* :class:`StepClock`: the worker's progress, which paces the exchange actor (``wait_step``),
  and the worker's life (``epoch``): a new one holds no replicas.
* :class:`ModelSource`: this node's public model as ``GET /v1/model`` serves it (the current
  :class:`~p2pnode.wire.served.ServedModel`) and a way to wait until it changes.

The HTTP API and the exchange get these, not the supervisor, so neither can start, stop or
reach into the worker; they talk to it only through the pipe client's ``deliver``.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from typing import Any

from p2pnode.wire.served import ServedModel


@dataclass
class TrainingState:
    """What status shows about training."""

    step: int = 0
    samples: int = 0
    loss: float = float("nan")
    lr: float = 0.0
    #: non-finite losses so far (each: model restored from its public copy, step size halved)
    nonfinite: int = 0
    #: the part of each batch trained on: under 1, the node is slower than the others and
    #: keeps their pace (exchange.sync_keep_pace)
    batch_share: float = 1.0
    done: bool = False
    accuracy: float | None = None
    test_loss: float | None = None
    eval_step: int = 0
    eval_samples: int = 0
    #: the last evaluation is of the model the consensus finish agreed on (Evaluate)
    eval_consensus: bool = False
    #: the consensus finish's agreed model measured worse than ours before it: we went back to
    #: ours and average no more (worker/finish_guard.py)
    finish_kept_own: bool = False
    #: the task's named metrics of the last evaluation (finite values only)
    metrics: dict[str, float] = field(default_factory=dict)
    params: int = 0
    #: samples per class in this node's shard (training.partition)
    classes: list[int] = field(default_factory=list)
    #: BatchNorm layers in the model (Hello)
    batchnorm_layers: int = 0
    #: the task's optimizer (its class name) and whether it is adaptive (Hello)
    optimizer: str = ""
    adaptive: bool = False
    fingerprint: str = ""
    epoch: str = ""
    resumed: bool = False
    worker_restarts: int = 0
    worker_alive: bool = False
    published_version: int = 0
    last_checkpoint_step: int | None = None
    last_checkpoint_at: float | None = None
    started_at: float = field(default_factory=time.monotonic)
    #: training.min_peers not met yet: [alive peers seen, peers wanted]; None: not waiting
    waiting_for_peers: list[int] | None = None
    #: training.start_settle: [alive peers, seconds left of the window] while a fresh node waits
    #: for membership to stop growing before its first step; None: not waiting
    settling: list[float] | None = None
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
        # NaN and infinities are not JSON (a browser refuses the whole document): None instead
        out = {k: None if isinstance(v, float) and not math.isfinite(v) else v
               for k, v in self.__dict__.items() if k not in hidden}
        out["train_seconds"] = None if self.train_seconds is None else round(self.train_seconds, 3)
        return out


class StepClock:
    """The worker's step count and life, read from the training state; the supervisor calls
    :meth:`tick` after each change so that waiters wake up."""

    def __init__(self, state: TrainingState) -> None:
        self._state = state
        #: set once the first worker said hello (there is a model to serve and to average into)
        self.ready = asyncio.Event()
        self._changed = asyncio.Condition()

    @property
    def step(self) -> int:
        return self._state.step

    @property
    def done(self) -> bool:
        """Reached ``training.max_samples``: the worker now only averages and serves."""
        return self._state.done

    @property
    def epoch(self) -> str:
        """The current worker life ("" before the first hello)."""
        return self._state.epoch

    @property
    def adaptive(self) -> bool:
        """The worker's optimizer adapts each coordinate's step (its hello; False before it)."""
        return self._state.adaptive

    @property
    def params(self) -> int:
        """The worker's model's parameters (its hello; 0 before it)."""
        return self._state.params

    @property
    def resumed(self) -> bool:
        """The current worker started from a checkpoint."""
        return self._state.resumed

    async def tick(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def wait_step(self, after: int) -> int:
        """Wait until the worker has taken a step past ``after``, training is over, or a new
        worker said hello (it resumes from a checkpoint, maybe at a lower step)."""
        epoch = self.epoch
        async with self._changed:
            await self._changed.wait_for(lambda: self.step > after or self.done or self.epoch != epoch)
        return self.step


class ModelSource:
    """This node's public model as served; None until the first worker said hello."""

    def __init__(self) -> None:
        self.served: ServedModel | None = None
        self._changed = asyncio.Condition()
        self._notifying: set[asyncio.Task[None]] = set()  # referenced until done

    def changed(self) -> None:
        """A publish, or a new worker's snapshot: wake every held ``GET /v1/model``."""

        async def notify() -> None:
            async with self._changed:
                self._changed.notify_all()

        task = asyncio.get_running_loop().create_task(notify())
        self._notifying.add(task)
        task.add_done_callback(self._notifying.discard)

    async def wait_published(self, version: int, epoch: str, timeout: float) -> None:
        """Wait until the public model moves past (epoch, version), at most ``timeout`` s."""

        def moved() -> bool:
            s = self.served
            return s is None or s.version != version or s.epoch != epoch

        try:
            async with asyncio.timeout(timeout):
                async with self._changed:
                    await self._changed.wait_for(moved)
        except TimeoutError:
            pass

    def status(self) -> dict[str, Any]:
        """The publish log's size: what this node keeps in memory to serve sparse deltas."""
        s = self.served
        return {"log_entries": s.log_len if s else 0, "log_bytes": s.log_nbytes if s else 0}
