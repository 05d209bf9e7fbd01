"""What membership keeps in the state dir: the node's identity, and the members it knew.

identity.json holds a node id and an incarnation counter. The id survives restarts so peers
recognise a rejoining node; the incarnation goes up on every start so that news of the new
life beats news of the old one.

The file is checked on load (an id a membership message could carry, an incarnation in
``[0, MAX_INCARNATION)``) and the value written is bounded the same way, so no claim from the
network and no damaged file can stop the node from starting: a file that fails the check is
set aside (renamed ``identity.json.invalid-<time>``) with a log line, and the node starts as a
new one, with a new id.

members.json holds the addresses of live (verified) members, at most ``MAX_SAVED_HINTS``: hints
for the next start, tried after the configured seeds, never required (a first node whose old
peers are all gone starts alone). An unreadable or malformed file is set aside the same way.
"""

from __future__ import annotations

import json
import logging
import secrets
from dataclasses import dataclass
from pathlib import Path

from p2pnode.checkpoint import set_aside, write_atomic
from p2pnode.membership.base import MAX_INCARNATION
from p2pnode.config.grammar import node_id_error
from p2pnode.membership.swim.messages import MessageError, check_addr

IDENTITY_FILE = "identity.json"
MEMBERS_FILE = "members.json"
#: addresses members.json holds at most (the protocol's own bound, SwimConfig.max_remembered, is lower)
MAX_SAVED_HINTS = 1024
#: a members.json larger than this is not read
MAX_HINTS_FILE_BYTES = 256 * 1024

log = logging.getLogger("p2pnode.node")


class InvalidIdentity(ValueError):
    """identity.json does not hold a usable node id and incarnation."""


@dataclass
class Identity:
    node_id: str
    incarnation: int
    path: Path

    def save(self) -> None:
        write_atomic(self.path, json.dumps({"node_id": self.node_id, "incarnation": self.incarnation}).encode())

    def raise_to(self, incarnation: int) -> None:
        """Record a higher incarnation (membership calls this when it refutes a suspicion)."""
        if incarnation > MAX_INCARNATION:
            log.error("not recording incarnation %d: above the limit of %d", incarnation, MAX_INCARNATION)
            return
        if incarnation > self.incarnation:
            self.incarnation = incarnation
            self.save()


def parse(data: bytes) -> tuple[str, int]:
    """(node id, stored incarnation) from the file's bytes; InvalidIdentity if they are not usable."""
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidIdentity(f"not JSON: {exc}") from None
    if not isinstance(obj, dict) or not {"node_id", "incarnation"} <= obj.keys():
        raise InvalidIdentity("expected a map with node_id and incarnation")
    node_id, incarnation = check_id(obj["node_id"]), obj["incarnation"]
    if type(incarnation) is not int or not 0 <= incarnation < MAX_INCARNATION:
        raise InvalidIdentity(f"incarnation must be an integer in [0, {MAX_INCARNATION}), got {incarnation!r:.40}")
    return node_id, incarnation


def _set_aside(path: Path, why: object, then: str) -> None:
    """Rename a bad file out of the way (never over an earlier one) and say so."""
    set_aside(path, why, then, log)


def check_id(node_id: str) -> str:
    """``node_id`` if a membership message could carry it (and a file hold it); InvalidIdentity if not."""
    why = node_id_error(node_id)
    if why is not None:
        raise InvalidIdentity(why)
    return node_id


def load_or_create(state_dir: Path, wanted: str = "") -> Identity:
    """Read the identity and bump its incarnation for this life; create one on first start
    (or when the stored one fails its check, after setting the file aside). ``wanted``
    (``node.id``): the id to have, whatever the file held; a file with another id gives way to
    it, and the node starts as a new member (its old id is called dead by the others in time)."""
    path = state_dir / IDENTITY_FILE
    node_id, incarnation = wanted or secrets.token_hex(8), 0
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        data = None
    if data is not None:
        try:
            stored_id, stored_inc = parse(data)
        except InvalidIdentity as exc:
            _set_aside(path, exc, f"starting as a new node, {node_id}")
        else:
            if not wanted or stored_id == wanted:
                node_id, incarnation = stored_id, stored_inc + 1
            else:
                log.warning("node.id is %s, but this state dir's node was %s: starting as a new member, %s "
                            "(peers call %s dead in time)", wanted, stored_id, wanted, stored_id)
    ident = Identity(node_id, incarnation, path)
    ident.save()
    return ident


def load_hints(state_dir: Path, own_addr: str) -> list[str]:
    """The addresses saved in members.json (without our own), at most MAX_SAVED_HINTS."""
    path = state_dir / MEMBERS_FILE
    try:
        if path.stat().st_size > MAX_HINTS_FILE_BYTES:
            _set_aside(path, f"over {MAX_HINTS_FILE_BYTES} bytes", "starting without remembered members")
            return []
        obj = json.loads(path.read_bytes())
        addrs = obj["addrs"]
        if not isinstance(addrs, list):
            raise TypeError("addrs is not a list")
        addrs = [check_addr(a) for a in addrs[:MAX_SAVED_HINTS]]
    except FileNotFoundError:
        return []
    except OSError as exc:
        log.warning("cannot read %s: %s; starting without remembered members", path, exc)
        return []
    except (ValueError, UnicodeDecodeError, KeyError, TypeError, MessageError) as exc:
        _set_aside(path, exc, "starting without remembered members")
        return []
    return [a for a in addrs if a != own_addr]


def save_hints(state_dir: Path, addrs: list[str]) -> None:
    """Save live members' addresses for the next start (nothing is written when there are none,
    so a node that lost its peers keeps the last useful list)."""
    if addrs:
        write_atomic(state_dir / MEMBERS_FILE, json.dumps({"addrs": addrs[:MAX_SAVED_HINTS]}).encode())
