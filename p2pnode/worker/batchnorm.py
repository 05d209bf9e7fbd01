"""BatchNorm statistics recomputed for the weights a node holds now, before it is evaluated.

Why: a BatchNorm layer evaluates with running statistics, an average of the batch statistics of
the weights the node held over its last few steps. Averaging with a peer moves the weights by a
jump (and, under the default sparse publish, towards a public copy that is partly several
publishes old), and the running statistics, averaged too, are then the statistics of no model
anyone holds. Training does not see it (a training step normalises with the batch's own
statistics) but evaluation does: three nodes training torchvision's ShuffleNet together
evaluated at chance at every evaluation while their training loss fell (docs/BENCHMARKS.md,
"BatchNorm after averaging"). Recomputing the statistics over a few training batches is what stochastic weight
averaging does for its averaged model (``torch.optim.swa_utils.update_bn``, whose steps this
follows; it is not called as is because a task feeds its model through ``Task.loss``, not
``model(input)``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any, TypeGuard

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm


def batchnorm_layers(model: nn.Module) -> list[_BatchNorm]:
    """The model's BatchNorm layers that keep running statistics."""
    return [m for m in model.modules() if _tracks(m)]


def _tracks(m: nn.Module) -> TypeGuard[_BatchNorm]:
    """A BatchNorm layer that keeps running statistics."""
    return isinstance(m, _BatchNorm) and m.track_running_stats


def statistics_names(model: nn.Module) -> list[tuple[str, str]]:
    """(running_mean, running_var) state-dict names of each of ``batchnorm_layers``, so that a
    peer's replica, flat tensors keyed by those names, can be pooled layer by layer
    (worker/averaging.py ``average_into``). A layer registered twice is named once, by its first
    name, as ``floating_state`` sends a shared tensor."""
    names = []
    for prefix, m in model.named_modules():
        if _tracks(m):
            dot = f"{prefix}." if prefix else ""
            names.append((f"{dot}running_mean", f"{dot}running_var"))
    return names


@torch.no_grad()
def refresh_batchnorm(model: nn.Module, batches: Iterator[Any], count: int,
                      forward: Callable[[nn.Module, Any], Any]) -> int:
    """Every BatchNorm layer's running statistics replaced by the plain mean of its batch
    statistics over ``count`` batches (``forward(model, batch)`` runs one, in training mode);
    the layers' momenta and the model's mode are put back. Returns the batches run (0: the
    model has no BatchNorm layer, ``count`` is 0 or ``batches`` is empty, and nothing was
    changed)."""
    layers = batchnorm_layers(model)
    todo = itertools.islice(batches, count if layers else 0)
    first = next(todo, None)
    if first is None:
        return 0
    was_training = model.training
    momenta = [m.momentum for m in layers]
    for m in layers:
        m.reset_running_stats()
        m.momentum = None  # a cumulative average over the batches run
    model.train()
    done = 0
    try:
        for batch in itertools.chain([first], todo):
            forward(model, batch)
            done += 1
    finally:
        for m, momentum in zip(layers, momenta):
            m.momentum = momentum
        model.train(was_training)
    return done


@torch.no_grad()
def variances_to_second_moments(model: nn.Module) -> None:
    """Each BatchNorm layer's running variance replaced by its second moment E[x^2] = var +
    mean^2, in place: means of (mean, E[x^2]) over nodes are the statistics of the nodes' data
    together (the variance of the union holds the spread between the nodes' means; a mean of
    variances does not). ``second_moments_to_variances`` undoes it."""
    for m in batchnorm_layers(model):
        assert m.running_var is not None and m.running_mean is not None
        m.running_var.add_(m.running_mean * m.running_mean)


@torch.no_grad()
def second_moments_to_variances(model: nn.Module) -> None:
    """var = E[x^2] - mean^2 again, in place (rounding can leave a tiny negative: clamped to 0)."""
    for m in batchnorm_layers(model):
        assert m.running_var is not None and m.running_mean is not None
        m.running_var.sub_(m.running_mean * m.running_mean).clamp_(min=0.0)


#: what was measured, for ``skew_warning`` (docs/ALGORITHMS.md, "BatchNorm on label-skewed shards")
SKEWED_MEASURED = ("on Dirichlet 0.1 shards a ShuffleNet reached 47 % with an exact all-reduce of gradients (DDP) "
                   "and 43-55 % in the synchronous mode, against 75 % when the same batches were normalised together")


def skew_warning(layers: int, skew: float | None, unlike: float) -> str | None:
    """A line for the operator of a node whose model has BatchNorm layers and whose shard's
    labels are far from an even mix (``skew`` > ``unlike``, total variation): a training step
    normalises the node's batch with that batch's own statistics, its own few classes', so the
    gradient it contributes is not that of a mixed batch, whatever the averaging. None where
    there is nothing to say."""
    if not layers or skew is None or skew <= unlike:
        return None
    return (f"the model has {layers} BatchNorm layers and this node's labels are {skew:.2f} from an even mix "
            f"(total variation): each node normalises its batches with its own classes' statistics, which no "
            f"averaging of gradients or models undoes ({SKEWED_MEASURED}); a model with GroupNorm or LayerNorm "
            f"instead does not depend on the batch (docs/ALGORITHMS.md, \"BatchNorm on label-skewed shards\")")
