"""Prometheus metrics of one SWIM instance, all named ``p2pnode_membership_*``.

They go on the registry the daemon gives (each node has its own); without one, on a fresh
private registry, never the process-wide default, so many instances can live in one process.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from p2pnode.membership.base import MemberState

MESSAGE_TYPES = ("ping", "ack", "ping-req", "nack", "gossip", "push-pull")


class SwimMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        p = "p2pnode_membership_"
        self.probes = Counter(p + "probes", "Protocol periods by result: ack (direct or indirect), late_ack "
                              "(only the last direct ping before suspecting was answered), failed (suspected)",
                              ["result"], registry=r)
        self.indirect_probes = Counter(p + "indirect_probes",
                                       "Indirect probe requests to helpers, by result (ack, nack, no_answer)",
                                       ["result"], registry=r)
        self.suspicions = Counter(p + "suspicions", "Members marked suspect here, by origin (local probe or gossip)",
                                  ["origin"], registry=r)
        self.refutations = Counter(p + "refutations", "Times this node refuted a suspicion of itself", registry=r)
        self.id_conflicts = Counter(p + "id_conflicts", "News of another node at another address with this "
                                    "node's id (ids must be unique: node.id)", registry=r)
        self.deaths = Counter(p + "deaths", "Members marked dead here", registry=r)
        self.joins = Counter(p + "joins", "Members that joined (or came back) as seen here", registry=r)
        self.leaves = Counter(p + "leaves", "Members seen leaving on purpose", registry=r)
        self.push_pulls = Counter(p + "push_pulls", "Full state exchanges started here, by result",
                                  ["result"], registry=r)
        self.messages_sent = Counter(p + "messages_sent", "Membership messages sent (requests and replies), by type",
                                     ["type"], registry=r)
        self.messages_received = Counter(p + "messages_received", "Membership messages received, by type",
                                         ["type"], registry=r)
        self.bytes_sent = Counter(p + "sent_bytes", "Encoded membership message bytes sent", registry=r)
        self.bytes_received = Counter(p + "received_bytes", "Encoded membership message bytes received",
                                      registry=r)
        # Members by state are the node's p2pnode_members (both protocols); no second gauge here.
        self.member_counts: dict[MemberState, int] = {}
        self.health = Gauge(p + "health_score", "Local health (Lifeguard awareness) score; 0 is healthy",
                            registry=r)
        self.incarnation = Gauge(p + "incarnation", "This node's incarnation number", registry=r)
        self.verifications = Counter(p + "verifications", "Probes of proposed members at their claimed address, "
                                     "by result (ok: a member now; failed: forgotten)", ["result"], registry=r)
        self.unverified = Gauge(p + "unverified", "Proposed members waiting for their verification probe",
                                registry=r)
        self.claims_refused = Counter(p + "claims_refused", "Member updates refused, by reason (stranger, "
                                      "incarnation, message_limit, source_full, full, recently_failed, table_full)",
                                      ["reason"], registry=r)
        # pre-bound children: no label lookups on the hot path
        self._sent = {t: self.messages_sent.labels(t) for t in MESSAGE_TYPES}
        self._received = {t: self.messages_received.labels(t) for t in MESSAGE_TYPES}
        self.probe_ok, self.probe_failed = self.probes.labels("ack"), self.probes.labels("failed")
        self.probes.labels("late_ack")
        for result in ("ack", "nack", "no_answer"):
            self.indirect_probes.labels(result)
        for result in ("ok", "failed"):
            self.push_pulls.labels(result)
        for origin in ("probe", "gossip"):
            self.suspicions.labels(origin)
        for result in ("ok", "failed"):
            self.verifications.labels(result)
        # plain totals, cheap to read (the simulator sums them over hundreds of instances)
        self.sent_total = 0
        self.received_total = 0
        self.sent_bytes_total = 0
        self.received_bytes_total = 0

    def observe(self, direction: str, msg_type: str, size: int) -> None:
        """Transport observer: one message of ``size`` bytes went out or came in."""
        if direction == "sent":
            self.sent_total += 1
            self.sent_bytes_total += size
            child = self._sent.get(msg_type)
            (child if child is not None else self.messages_sent.labels("other")).inc()
            self.bytes_sent.inc(size)
        else:
            self.received_total += 1
            self.received_bytes_total += size
            child = self._received.get(msg_type)
            (child if child is not None else self.messages_received.labels("other")).inc()
            self.bytes_received.inc(size)

    def set_members(self, counts: dict[MemberState, int]) -> None:
        self.member_counts = dict(counts)
