"""Local training on this node's shard: the paper's steps 1-5 (sample, gradient, per-layer
threshold mask, momentum SGD step), plus evaluation. No networking here.

What is trained comes from the task (``training.task``, p2pnode/tasks/): its model, its data
read through the worker's DataLoader (p2pnode/tasks/loader.py), the loss of a batch and the
named metrics of an evaluation. The built-in models and data sets are a task like any other."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from p2pnode.compression.pipeline import GradientPipeline
from p2pnode.config import Config, parse_shard
from p2pnode.config.mode_rule import ADAPTIVE_MEASURED, choose, label_skew, remedy
from p2pnode.tasks import loader, runtime
from p2pnode.partition import UNLIKE, histogram
from p2pnode.worker.batchnorm import batchnorm_layers, refresh_batchnorm, skew_warning
from p2pnode.worker.public import KEEP_LOCAL
from p2pnode.worker.qgm import QuasiGlobalSGD


log = logging.getLogger("p2pnode.worker")

#: optimizers that scale each coordinate's step by its own gradient history: averaging models
#: mixes them badly in gossip mode (docs/ALGORITHMS.md, "Adaptive optimizers (AdamW) and averaging")
ADAPTIVE = (torch.optim.Adam, torch.optim.AdamW, torch.optim.Adamax, torch.optim.NAdam, torch.optim.RAdam,
            torch.optim.Adagrad, torch.optim.Adadelta, torch.optim.RMSprop)

#: finite steps after which a step size halved by a divergence is doubled back
RECOVERY_STEPS = 100
MIN_LR_SCALE = 1.0 / 1024
#: the fewest items a part of a batch holds (batch norm needs two)
MIN_ITEMS = 2


def build_optimizer(name: str, model: torch.nn.Module, lr: float, momentum: float,
                    weight_decay: float) -> torch.optim.Optimizer:
    """``sgd``: momentum SGD with the node's own buffer (the paper's); ``qgm``: quasi-global
    momentum, whose buffer follows the model's moves including averaging (worker/qgm.py)."""
    if name == "qgm":
        return QuasiGlobalSGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)


def advise_adaptive(optimizer: torch.optim.Optimizer, cfg: Config) -> bool:
    """Say once in the log, for a gossip node whose task brings an adaptive optimizer (AdamW...),
    what was measured: such a cluster ends far from the all-reduce reference even with whole
    copies from two peers (config/adaptive_gossip.py), the synchronous mode near it; and what would pick the synchronous mode (a cluster secret,
    under exchange.sync = "auto"). Returns whether it said so."""
    choice = choose(cfg)
    if not isinstance(optimizer, ADAPTIVE) or choice.name != "gossip":
        return False
    fix = remedy(choice) or f"gossip was picked because {choice.why}"
    log.warning("the task's optimizer %s adapts each coordinate's step: %s; %s (docs/ALGORITHMS.md, \"Adaptive "
                "optimizers (AdamW) and averaging\")", type(optimizer).__name__, ADAPTIVE_MEASURED, fix)
    return True


def batch_seed(seed: int, shard_index: int) -> int:
    """The seed of a node's batch stream: its own for each shard, the same at every restart
    (``seek``), and what benchlib/ddp.py draws from to give DDP's ranks the nodes' batches."""
    return seed * 7919 + shard_index


class ShardTrainer:
    """Model, optimizer, gradient compression and the shard, stepped one batch at a time."""

    def __init__(self, cfg: Config) -> None:
        t = cfg.training
        self.cfg = cfg
        torch.set_num_threads(t.threads)
        shard_index, _ = parse_shard(t.shard)
        loaded = runtime.load(cfg)
        self.task, self.task_name, self.device = loaded.task, loaded.label, loaded.device
        #: this node's shard (``.labels``: class per item, empty when the task has none)
        self.train_split, self.test_split = loaded.shard, loaded.test
        # Every node of a cluster starts from the same weights (same training.seed): averaging
        # models that began from different random points mixes unrelated features.
        torch.manual_seed(t.seed)
        self.model = self.task.build_model().to(self.device)
        if getattr(self.task, "keep_local", ()):  # state the task keeps out of averaging (public.py)
            setattr(self.model, KEEP_LOCAL, tuple(self.task.keep_local))  # type: ignore[attr-defined]
        self.fingerprint = runtime.fingerprint(self.task_name, self.model)
        #: the last evaluation's named metrics (the task's: loss, accuracy, perplexity...)
        self.metrics: dict[str, float] = {}
        torch.manual_seed(t.seed * 1000 + shard_index + 1)
        own = getattr(self.task, "optimizer", None)  # a task may bring its own (docs/TASKS.md)
        self.optimizer = (own(self.model, t.lr) if own is not None
                          else build_optimizer(t.optimizer, self.model, t.lr, t.momentum, t.weight_decay))
        self.gradients = GradientPipeline(cfg.compression.gradient, cfg.compression.gradient_memory)
        advise_adaptive(self.optimizer, cfg)
        self.advise_batchnorm()
        self.step = 0
        self.samples = 0
        self.last_batch = t.batch_size  #: items in the last step's batch
        #: the part of each batch trained on (exchange.sync_keep_pace: a node slower than the
        #: others takes fewer items, not fewer rounds); the rest of the batch is drawn and
        #: counted all the same, so every node's schedule and end stay the group's
        self.batch_share = 1.0
        self.loss_ema = float("nan")
        self.nonfinite_steps = 0
        #: step-size factor after a divergence: halved at each non-finite loss (so a recovery
        #: does not put the same model back into the same step), doubled back every
        #: RECOVERY_STEPS finite steps until it is 1 again
        self.lr_scale = 1.0
        self._finite_run = 0
        self._shard_index = shard_index
        #: training batches drawn from the shard's stream (kept in the checkpoint: a resumed node
        #: goes on through its shard, not from its first batches again)
        self.drawn = 0
        self._batches: Iterator[Any] | None = None
        #: the BatchNorm statistics are the cluster's (pooled by the synchronous mode's models'
        #: mean after training, worker/main.py ``final_mean``): an evaluation keeps them rather
        #: than recomputing them over our own shard, until the next training step
        self.norms_pooled = False
        self.seek(0)

    @property
    def done(self) -> bool:
        limit = self.cfg.training.max_samples
        return bool(limit) and self.samples >= limit

    def lr_now(self) -> float:
        """Linear warm-up over ``warmup_samples`` (large rates with momentum can blow up in the
        first steps from random weights), then constant or cosine decay to 0 at max_samples."""
        t = self.cfg.training
        lr = t.lr
        if t.lr_schedule == "cosine" and t.max_samples:
            frac = min(1.0, self.samples / t.max_samples)
            lr = t.lr * 0.5 * (1.0 + math.cos(math.pi * frac))
        if t.warmup_samples and self.samples < t.warmup_samples:
            lr *= (self.samples + t.batch_size) / (t.warmup_samples + t.batch_size)
        return lr * self.lr_scale

    def diverged(self) -> float:
        """A non-finite loss was seen: halve the step size (down to 1/1024); returns the new factor."""
        self.lr_scale = max(MIN_LR_SCALE, self.lr_scale * 0.5)
        self._finite_run = 0
        return self.lr_scale

    def seek(self, drawn: int) -> None:
        """The shard's batch stream as it is after ``drawn`` batches (the same permutations from
        the same seed), whatever was drawn before."""
        t = self.cfg.training
        self._batches = None  # a reader process of the old stream ends with it
        self._gen = torch.Generator().manual_seed(batch_seed(t.seed, self._shard_index))
        self._batches = loader.train_batches(self.task, self.train_split, t.batch_size, self._gen, t.loader_workers,
                                             max(0, drawn))
        self.drawn = max(0, drawn)

    def _next_batch(self) -> Any:
        """The next shuffled batch of the shard, on the training device."""
        assert self._batches is not None
        self.drawn += 1
        return loader.to_device(next(self._batches), self.device)

    def train_step(self, reduce: Callable[[], bool | None] | None = None) -> float:
        """One local step; ``reduce`` (exchange.sync) replaces the gradients by the network's
        mean before they are clipped and stepped along, or (returning False) has stepped the
        model itself instead (``step_along``: the rounds a late node missed)."""
        self.model.train()
        self.norms_pooled = False
        batch = self._next_batch()
        drawn = loader.batch_len(batch)
        if self.batch_share < 1.0:
            batch = loader.head(batch, max(MIN_ITEMS, min(drawn, round(drawn * self.batch_share))))
        lr = self.lr_now()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=False)
        loss = self.task.loss(self.model, batch)
        runtime.check_loss(loss)
        value = float(loss.detach())
        self.step += 1
        self.last_batch = drawn
        self.samples += self.last_batch
        if not math.isfinite(value):
            # A diverged batch: taking the step would spread NaN into the model and, through
            # publishing, nowhere else (the wire refuses it). Skip it and let the caller decide.
            self.nonfinite_steps += 1
            return value
        loss.backward()
        self.gradients.begin_step()
        for name, param in self.model.named_parameters():
            if param.grad is not None:
                param.grad.copy_(self.gradients.apply(name, param.grad))
        if reduce is not None and reduce() is False:
            self._note(value)
            return value
        self._clip_and_step()
        self._note(value)
        return value

    def _clip_and_step(self) -> None:
        if self.cfg.training.grad_clip > 0:
            # a blown-up gradient on a skewed shard would otherwise carry the model (and, through
            # averaging, its peers) to non-finite values in a step or two
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.training.grad_clip)
        self.optimizer.step()

    def drop_step(self) -> None:
        """The step just counted took no step of its own (exchange.sync: the rounds it missed
        replace it): uncount it."""
        self.step -= 1
        self.samples -= self.last_batch

    def step_along(self, grads: dict[str, torch.Tensor]) -> None:
        """A step along given gradients (exchange.sync: a round this node missed, as every
        node in it took it: the same learning rate, clipping and optimizer step)."""
        lr = self.lr_now()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        for name, param in self.model.named_parameters():
            if name not in grads:
                continue
            if param.grad is None:
                param.grad = grads[name].detach().clone().view_as(param)
            else:
                param.grad.copy_(grads[name].view_as(param.grad))
        self._clip_and_step()
        self.step += 1
        self.samples += self.cfg.training.batch_size

    def _note(self, value: float) -> None:
        """A finite step's loss: into the average, and towards the full step size again."""
        self.loss_ema = value if math.isnan(self.loss_ema) else 0.95 * self.loss_ema + 0.05 * value
        self._finite_run += 1
        if self.lr_scale < 1.0 and self._finite_run >= RECOVERY_STEPS:
            self.lr_scale, self._finite_run = min(1.0, self.lr_scale * 2), 0

    @torch.no_grad()
    def evaluate(self, limit: int = 0) -> tuple[float, float, int]:
        """(accuracy, mean loss, items) on the first ``limit`` test items (0: all); the task's
        every metric is kept in ``self.metrics``. A task without accuracy gives NaN (status: null).
        BatchNorm statistics are first recomputed for the weights as they are (``refresh_norms``)."""
        self.refresh_norms()
        self.model.eval()
        batches, n = loader.eval_batches(self.task, self.test_split, limit, self.device)
        self.metrics = {k: float(v) for k, v in self.task.evaluate(self.model, batches).items()}
        return self.metrics.get("accuracy", float("nan")), self.metrics.get("loss", float("nan")), n

    def advise_batchnorm(self) -> str | None:
        """Say once in the log when the model has BatchNorm layers and this shard's labels are
        skewed (batchnorm.py ``skew_warning``); returns the line, or None."""
        labels = self.train_split.labels
        classes = int(getattr(self.task, "num_classes", 0))
        if not len(labels) or not classes:
            return None
        line = skew_warning(len(batchnorm_layers(self.model)), label_skew(histogram(labels.numpy(), classes)), UNLIKE)
        if line:
            log.warning(line)
        return line

    def refresh_norms(self) -> int:
        """BatchNorm running statistics recomputed over ``training.bn_refresh`` batches of the
        shard (p2pnode/worker/batchnorm.py: averaging leaves statistics of no model anyone
        holds). The batches come from a stream of their own, the same at every refresh, so the
        training stream and the model's weights are left as they were. Returns the batches run
        (0 too when the statistics are the cluster's: ``norms_pooled``)."""
        count = self.cfg.training.bn_refresh
        if count <= 0 or self.norms_pooled or not batchnorm_layers(self.model):
            return 0
        gen = torch.Generator().manual_seed(batch_seed(self.cfg.training.seed, self._shard_index) + 104729)
        stream = loader.train_batches(self.task, self.train_split, self.cfg.training.batch_size, gen, 0)
        batches = (loader.to_device(b, self.device) for b in stream)
        return refresh_batchnorm(self.model, batches, count, self.task.loss)

    def checkpoint_accuracy(self, state_dir: Path) -> float | None:
        """Accuracy on the whole test set of the checkpoint in ``state_dir`` (None: there is
        none). Loads it into this trainer's model: for reports after a run, not during one."""
        from p2pnode.checkpoint import CHECKPOINT_NAME, load

        state = load(Path(state_dir) / CHECKPOINT_NAME)
        if state is None:
            return None
        self.model.load_state_dict(state["model"])
        return self.evaluate(0)[0]

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "gradients": self.gradients.state_dict(),
            "step": self.step,
            "samples": self.samples,
            "loss_ema": self.loss_ema,
            "lr_scale": self.lr_scale,
            "nonfinite_steps": self.nonfinite_steps,
            "drawn": self.drawn,
            "norms_pooled": self.norms_pooled,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if "gradients" in state:
            self.gradients.load_state_dict(state["gradients"])
        self.step = int(state["step"])
        self.samples = int(state["samples"])
        self.loss_ema = float(state.get("loss_ema", float("nan")))
        scale = float(state.get("lr_scale", 1.0))
        self.lr_scale = scale if MIN_LR_SCALE <= scale <= 1.0 else 1.0
        self.nonfinite_steps = int(state.get("nonfinite_steps", 0))
        self.norms_pooled = bool(state.get("norms_pooled", False))
        # where the batch stream was (a checkpoint from before it was kept: one batch a step)
        self.seek(int(state.get("drawn", self.step)))
