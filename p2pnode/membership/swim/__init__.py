"""SWIM membership with the Lifeguard refinements, modelled on HashiCorp memberlist.

See docs/MEMBERSHIP.md for the design and docs/PROTOCOL.md ("Membership messages") for the wire
format. ``SwimMembership`` is the actor the daemon runs; ``SwimConfig`` its settings.
"""

from p2pnode.config.swim import SwimConfig
from p2pnode.membership.swim.membership import SwimMembership
from p2pnode.membership.swim.transport import HttpTransport, Transport, TransportError

__all__ = ["HttpTransport", "SwimConfig", "SwimMembership", "Transport", "TransportError"]
