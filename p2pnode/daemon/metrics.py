"""Prometheus metrics of one node, on a registry of its own (tests run several nodes in one
process). Names are ``p2pnode_*`` in base units; counters end in ``_total``."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class NodeMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        self.steps = Counter("p2pnode_training_steps", "Local training steps taken", registry=r)
        self.samples = Counter("p2pnode_training_samples", "Training samples processed", registry=r)
        self.loss = Gauge("p2pnode_training_loss", "Last training mini-batch loss", registry=r)
        self.accuracy = Gauge("p2pnode_test_accuracy_ratio", "Last test-set accuracy (0-1)", registry=r)
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
