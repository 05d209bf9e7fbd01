"""Who may push: ``POST /v1/model?from=NODE_ID``, and the POST routes a mode marks so (a
parameter server's ``/v1/ps/gradient``, the synchronous mode's ``/v1/sync``), from members only
(``exchange.accept_pushes``).

A pushed model is averaged into ours like a fetched one, so a push is as strong as an exchange
and must come from where an exchange would: a member. A pushed gradient moves a parameter
server's model by a whole step, so the same rule guards it: a server's ps-workers join its
membership through their first seed (the server), and push from the address they joined with.
Without a cluster secret nothing proves who sent a request, but two things can be checked from
its headers alone, before a byte of the body is read (so refused pushes cost nothing, floods
included):

* ``from`` names a *running member* of our membership table: with SWIM a member verified at
  its address (it answered a probe there with its id) that is alive or suspect, never a
  candidate, a dead or a departed node; with the simple protocol an alive member;
* the request comes from that member's advertised host: the source IP equals the host of its
  address (loopback matches loopback, an IPv4-mapped IPv6 source its IPv4 address). A member
  advertised under a host name cannot push (nothing here resolves names on a request).

A push that fails either check gets 403 with a one-line JSON error, is counted in
``p2pnode_payloads_rejected_total{reason="not-member"}`` and in status (``pushes``), and changes
nothing. A stranger on the member's own host can still pass as it (the source address is all
there is without a secret); with the cluster secret set the signature proves membership of the
cluster, and the member check still applies. ``"any"`` turns the check off (tests of body
handling against a single daemon, closed networks): only ``from`` must be well formed.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import Any

from aiohttp import web

from p2pnode.membership.base import Member
from p2pnode.net.server import error

#: the choices of ``exchange.accept_pushes``
ACCEPT_PUSHES = ("members", "any")
#: the refusal's reason label in p2pnode_payloads_rejected_total
NOT_MEMBER = "not-member"
PUSH_PATH = "/v1/model"

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def _ip(host: str) -> IpAddress | None:
    """``host`` as an IP address ("localhost" as loopback; a mapped IPv6 as its IPv4), or None."""
    if host.lower() == "localhost":
        return ipaddress.ip_address("127.0.0.1")
    try:
        ip = ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def same_host(advertised: str, remote: str | None) -> bool:
    """Whether a request from ``remote`` (an IP) comes from the host of ``advertised``
    (HOST:PORT): the same address, or loopback on both sides."""
    host = _ip(advertised.rpartition(":")[0])
    source = _ip(remote or "")
    if host is None or source is None:
        return False
    return host == source or (host.is_loopback and source.is_loopback)


def push_origin_error(member: Member | None, node_id: str, remote: str | None) -> str | None:
    """Why a push naming ``node_id`` from ``remote`` is not a member's (None: it is)."""
    if member is None:
        return f"pushes are taken from members only; {node_id!r} is not a live, verified member here"
    if not same_host(member.addr, remote):
        return f"pushes are taken from members only; {node_id!r} is at {member.addr}, not at {remote}"
    return None


def _well_formed(node_id: str) -> bool:
    return 0 < len(node_id) <= 64 and node_id.isprintable()


class PushPolicy:
    """The precheck of a POST to one of ``paths`` (``POST /v1/model`` and a mode's members-only
    routes): ``?from=`` well formed (400), and with ``"members"`` a running member's, sent from
    its host (403). ``lookup(node_id)`` is the membership's ``pusher``; ``count(reason)`` counts
    a refusal in the rejected-payload metric."""

    def __init__(self, mode: str, lookup: Callable[[str], Member | None], count: Callable[[str], None],
                 paths: tuple[str, ...] = (PUSH_PATH,)) -> None:
        if mode not in ACCEPT_PUSHES:
            raise ValueError(f"exchange.accept_pushes: {mode!r}; choose one of {', '.join(ACCEPT_PUSHES)}")
        self.mode = mode
        self.paths = paths
        self.lookup = lookup
        self.count = count
        self.refused = 0
        self.last_refused: dict[str, str] | None = None

    def from_member(self, request: web.Request) -> bool:
        """Whether ``request`` names (``?from=NODE_ID``) a running member and comes from its host,
        or anyone with ``"any"``: who may make a node that publishes on fetch publish first
        (daemon/http.py), by the same rule as a push."""
        peer = request.query.get("from", "")
        return self.mode == "any" or (_well_formed(peer) and
                                      push_origin_error(self.lookup(peer), peer, request.remote) is None)

    def precheck(self, request: web.Request) -> web.Response | None:
        if request.method != "POST" or request.path not in self.paths:
            return None
        peer = request.query.get("from", "")
        if not _well_formed(peer):
            self.count("bad-request")
            return error(400, "?from=NODE_ID is required")
        if self.mode == "any":
            return None
        why = push_origin_error(self.lookup(peer), peer, request.remote)
        if why is None:
            return None
        self.count(NOT_MEMBER)
        self.refused += 1
        self.last_refused = {"from": peer[:64], "remote": str(request.remote), "error": why}
        return error(403, why)

    def status(self) -> dict[str, Any]:
        return {"accept": self.mode, "refused": self.refused, "last_refused": self.last_refused}
