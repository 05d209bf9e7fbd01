"""Prometheus metrics of one node, on a registry of its own (tests run several nodes in one
process). Names are ``p2pnode_*`` in base units; counters end in ``_total``.

Made to alert on (conf/p2pnode-alerts.yml): every known label value exists at 0 from the start,
so ``rate(p2pnode_exchanges_total{result="timeout"}[5m])`` is 0 on a healthy node rather than
"no data"; the test accuracy is NaN until the first evaluation (not a false 0); no
``_created`` series; process metrics (``p2pnode_process_*``) and ``p2pnode_build_info``.
"""

from __future__ import annotations

import platform
import time
from collections import deque

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, disable_created_metrics

from p2pnode import __version__
from p2pnode.membership.base import MemberState
from p2pnode.pipe_protocol import REFUSAL_REASONS

# One ``_created`` sample per counter and histogram doubles the series for no alert's benefit.
disable_created_metrics()

#: every ``result`` of p2pnode_exchanges_total (exchange/rounds.py)
EXCHANGE_RESULTS = ("ok", "not_modified", "unavailable", "local", "resync", "timeout", "error", "slow", "rejected")
#: every ``reason`` of p2pnode_payloads_rejected_total: the worker's refusals of a peer's payload
#: and the HTTP layer's (net/guard.py, net/server.py, daemon/http.py)
REJECT_REASONS = (*REFUSAL_REASONS, "bad-request", "unauthorized", "replayed", "rate-limited", "busy", "slow-body",
                  "not-member")
#: every ``kind`` of p2pnode_model_requests_total
REQUEST_KINDS = ("snapshot", "delta", "chain", "not_modified")
#: p2pnode_training_diverging turns 1 at this many non-finite losses (each a restore of the
#: model and a halved step size) within DIVERGING_WINDOW seconds: a worker that keeps restoring
DIVERGING_LOSSES = 10
DIVERGING_WINDOW = 300.0


class NodeMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        ProcessCollector(namespace="p2pnode", registry=r)  # p2pnode_process_resident_memory_bytes, cpu, fds
        self.build = Gauge("p2pnode_build_info", "Always 1; labels say which p2pnode and Python run here",
                           ["version", "python"], registry=r)
        self.build.labels(__version__, platform.python_version()).set(1)
        self.steps = Counter("p2pnode_training_steps", "Local training steps taken", registry=r)
        self.samples = Counter("p2pnode_training_samples", "Training samples processed", registry=r)
        self.loss = Gauge("p2pnode_training_loss", "Last training mini-batch loss", registry=r)
        self.accuracy = Gauge("p2pnode_test_accuracy_ratio", "Last test-set accuracy (0-1; NaN before the first "
                              "evaluation)", registry=r)
        self.accuracy.set(float("nan"))
        self.test_metric = Gauge("p2pnode_test_metric", "Each named metric of the task's last evaluation "
                                 "(loss, accuracy, perplexity...; docs/TASKS.md)", ["name"], registry=r)
        self.exchanges = Counter("p2pnode_exchanges", "Model fetches from peers by outcome",
                                 ["result"], registry=r)
        self.exchange_seconds = Histogram(
            "p2pnode_exchange_duration_seconds", "Time to fetch a peer's model", registry=r,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0))
        self.bytes_received = Counter("p2pnode_exchange_received_bytes", "Model payload bytes fetched from peers",
                                      registry=r)
        self.bytes_served = Counter("p2pnode_model_served_bytes", "Model payload bytes served to peers",
                                    registry=r)
        self.requests_served = Counter("p2pnode_model_requests", "Model requests answered, by kind",
                                       ["kind"], registry=r)
        self.rejected = Counter("p2pnode_payloads_rejected", "Peer payloads refused, by reason",
                                ["reason"], registry=r)
        self.worker_restarts = Counter("p2pnode_worker_restarts", "Training worker restarts", registry=r)
        self.published_version = Gauge("p2pnode_published_version", "Version of this node's public model",
                                       registry=r)
        self.published_bytes = Counter("p2pnode_published_bytes", "Encoded bytes of published deltas",
                                       registry=r)
        self.members = Gauge("p2pnode_members", "Known members by state", ["state"], registry=r)
        self.checkpoints = Counter("p2pnode_checkpoints", "Checkpoints written", registry=r)
        self.checkpoint_failures = Counter("p2pnode_checkpoint_failures", "Checkpoints that failed",
                                           registry=r)
        self.nonfinite = Counter("p2pnode_training_nonfinite_losses", "Non-finite losses: each restored the "
                                 "model from its public copy and halved the step size", registry=r)
        self.lr = Gauge("p2pnode_training_learning_rate", "Step size now (after schedule and divergence back-off)",
                        registry=r)
        self.consensus_distance = Gauge(
            "p2pnode_consensus_distance_ratio", "After training: largest ||x - x_peer|| / ||x|| over alive peers "
            "(NaN before it is measured)", registry=r)
        self.finish_refused = Counter(
            "p2pnode_consensus_refused", "Consensus finishes whose agreed model measured worse on the held-out split "
            "than the node's own before the finish: the node went back to its own (worker/finish_guard.py)", registry=r)
        self.clipped = Counter("p2pnode_exchanges_clipped", "Peer models averaged in clipped to the robust radius "
                               "(exchange.robust = clip): a peer further away than usual, or poisoned", registry=r)
        self.clip_radius = Gauge("p2pnode_averaging_clip_radius_ratio", "The robust averaging radius tau relative to "
                                 "||x|| at the last exchange (NaN before one, or with exchange.robust = none)",
                                 registry=r)
        self.clip_radius.set(float("nan"))
        self.diverging = Gauge(
            "p2pnode_training_diverging", f"1 while the worker keeps restoring: at least {DIVERGING_LOSSES} "
            f"non-finite losses in the last {DIVERGING_WINDOW:g} s; else 0", registry=r)
        self._nonfinite_at: deque[float] = deque(maxlen=DIVERGING_LOSSES)
        self.loop_lag = Histogram(
            "p2pnode_event_loop_lag_seconds", "How late the event loop's probe woke up (daemon/looplag.py): "
            "the time one callback kept the loop, and every ping and request, waiting", registry=r,
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5))
        self.loop_lag_max = Gauge("p2pnode_event_loop_lag_max_seconds", "The event loop's longest stall since "
                                  "start (daemon/looplag.py)", registry=r)
        for result in EXCHANGE_RESULTS:
            self.exchanges.labels(result)
        for reason in REJECT_REASONS:
            self.rejected.labels(reason)
        for kind in REQUEST_KINDS:
            self.requests_served.labels(kind)
        for state in MemberState:
            self.members.labels(str(state))

    def note_nonfinite(self, new: int, now: float | None = None) -> None:
        """Count ``new`` non-finite losses (0 is fine: it lets the health signal recover) and
        update p2pnode_training_diverging."""
        now = time.monotonic() if now is None else now
        if new > 0:
            self.nonfinite.inc(new)
            self._nonfinite_at.extend([now] * min(new, DIVERGING_LOSSES))
        recent = sum(1 for t in self._nonfinite_at if now - t <= DIVERGING_WINDOW)
        self.diverging.set(1 if recent >= DIVERGING_LOSSES else 0)
