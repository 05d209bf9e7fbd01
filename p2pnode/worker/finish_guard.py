"""The consensus finish's guard: a node does not end with a merged model worse than its own.

Why: after training, the consensus finish averages the nodes' models until they agree. Models
that drifted apart (label-skewed shards, nodes that trained apart: started 30 s apart on
Dirichlet-0.1 shards) average into a model worse than any of them: measured 3.3-4.6 pt under
the best node's own model before the finish (docs/BENCHMARKS.md, "Nodes started 30 s apart").

How: when training ends the worker keeps a copy of its model and the figures of its final
evaluation (the whole held-out split). When the daemon says the finish agreed (``Evaluate``
with ``consensus``), the worker evaluates the agreed model on the same split; if it is worse
by more than that evaluation's noise, the node goes back to its own model, publishes it whole,
and from then on averages nothing more (it keeps taking its peers' payloads, so its replicas
stay in step). Peers still averaging move towards it: the better model wins the finish instead
of being averaged away. The held-out split is the task's test set, the same on every node, so
the decision is fair across nodes whatever their shards; it is a validation use of that split
(docs/ALGORITHMS.md, "Consensus finish").
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch

from p2pnode.worker.public import floating_state

log = logging.getLogger("p2pnode.worker")

#: a task without accuracy (a regression, a language model) is compared by its held-out loss:
#: a merge whose loss is over the node's own by more than this share is refused
LOSS_MARGIN = 0.01


#: standard errors of the accuracy a merge must lose by to be refused
NOISE_SE = 2.0


def accuracy_noise(accuracy: float, samples: int) -> float:
    """One standard error of an accuracy measured on ``samples`` items: sqrt(p (1 - p) / n).
    The guard asks for NOISE_SE of them: it keeps a merge that is a draw (nodes started
    together: the finish's model is within 0.04 pt of each node's own; at 87 % on 10 000 images
    the margin is 0.67 pt, on 2 000 1.5 pt) and refuses the 3-5 pt losses it is for. One standard
    error refused a draw about one time in six per node (three nodes whose models agree)."""
    if samples <= 0 or not math.isfinite(accuracy):
        return 0.0
    p = min(max(accuracy, 0.0), 1.0)
    return math.sqrt(p * (1.0 - p) / samples)


@dataclass
class Figures:
    accuracy: float
    loss: float
    samples: int


def worse(merged: Figures, own: Figures) -> bool:
    """Whether ``merged`` is worse than ``own`` by more than the evaluation's noise: by its
    accuracy when the task has one, the loss agreeing (a merge that loses accuracy but not loss
    is a draw near chance: models at 9-10 % on 512 items, the merge's loss a fifth of the node's
    own, was refused on accuracy alone); else by the loss."""
    losses = math.isfinite(merged.loss) and math.isfinite(own.loss)
    if math.isfinite(merged.accuracy) and math.isfinite(own.accuracy):
        if merged.accuracy >= own.accuracy - NOISE_SE * accuracy_noise(own.accuracy, own.samples):
            return False
        return not losses or merged.loss > own.loss
    if losses:
        return merged.loss > own.loss + LOSS_MARGIN * abs(own.loss)
    return False


class FinishGuard:
    """The node's own model when training ended, and whether the finish's merge was refused."""

    def __init__(self) -> None:
        self.own: dict[str, torch.Tensor] | None = None
        self.figures: Figures | None = None
        #: the finish's merge was refused: the node keeps its own model and averages no more
        self.kept_own = False
        #: what the refused merge measured (status, log)
        self.refused: Figures | None = None

    def training_ended(self, model: torch.nn.Module, figures: Figures) -> None:
        """Keep the model as training left it, with its final figures (once: a later call, the
        final figure asked again, does not replace it)."""
        if self.own is None:
            self.own = {k: v.detach().clone() for k, v in floating_state(model).items()}
            self.figures = figures

    def check(self, model: torch.nn.Module, merged: Figures) -> bool:
        """The finish agreed on ``model`` (measured ``merged``): True if it is refused, the
        model then put back to the node's own (the caller publishes it)."""
        if self.kept_own or self.own is None or self.figures is None or not worse(merged, self.figures):
            return False
        with torch.no_grad():
            for name, tensor in floating_state(model).items():
                tensor.copy_(self.own[name])
        self.kept_own, self.refused = True, merged
        own = self.figures
        log.warning("consensus finish refused: the agreed model measures accuracy %.4f / loss %.4f on %d held-out "
                    "items, our own model before the finish %.4f / %.4f; keeping ours and averaging no more",
                    merged.accuracy, merged.loss, merged.samples, own.accuracy, own.loss)
        return True
