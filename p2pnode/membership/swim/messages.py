"""SWIM messages: dataclasses, their msgpack-able dict form, and strict decoding.

Every message is a map with ``v`` (protocol version, 1) and ``t`` (type). Member updates
(alive / suspect / dead / left) ride in the ``u`` list of probe and gossip messages; push-pull
carries whole member records. ``decode`` accepts exactly the documented shape: a missing or
unknown key, a wrong type, an out-of-range number or an oversized string or list raises
``MessageError`` naming the message type and the field. docs/PROTOCOL.md describes the format.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

from p2pnode.config.grammar import MAX_ID
from p2pnode.membership.base import MemberState

VERSION = 1
MAX_ADDR = 255  # characters in "host:port"
MAX_UPDATES = 256  # updates in one message (the byte budget usually stops far earlier)
MAX_RECORDS = 65536  # member records in one push-pull
MAX_U64 = 2**64 - 1
MAX_TIMEOUT_MS = 600_000


class MessageError(ValueError):
    """A message that does not have the documented shape."""


# --- member updates (piggybacked) ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Alive:
    node: str
    incarnation: int
    addr: str


@dataclass(frozen=True, slots=True)
class Suspect:
    node: str
    incarnation: int
    sender: str  # who suspects it: independent confirmations are counted per sender


@dataclass(frozen=True, slots=True)
class Dead:
    node: str
    incarnation: int
    sender: str


@dataclass(frozen=True, slots=True)
class Left:
    node: str
    incarnation: int


Update = Union[Alive, Suspect, Dead, Left]

UPDATE_STATE: dict[type, MemberState] = {Alive: MemberState.ALIVE, Suspect: MemberState.SUSPECT,
                                         Dead: MemberState.DEAD, Left: MemberState.LEFT}


@dataclass(frozen=True, slots=True)
class Record:
    """One member as a push-pull lists it."""

    node: str
    addr: str
    state: MemberState
    incarnation: int


# --- messages ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ping:
    seq: int
    sender: str
    sender_addr: str
    sender_incarnation: int
    target: str  # the id we mean to reach: a different node at that address must not ack
    updates: tuple[Update, ...] = ()


@dataclass(frozen=True, slots=True)
class Ack:
    seq: int
    sender: str
    updates: tuple[Update, ...] = ()


@dataclass(frozen=True, slots=True)
class PingReq:
    seq: int
    sender: str
    target: str
    target_addr: str
    timeout_ms: int  # the helper must answer (ack or nack) within this
    updates: tuple[Update, ...] = ()


@dataclass(frozen=True, slots=True)
class Nack:
    seq: int
    sender: str
    updates: tuple[Update, ...] = ()


@dataclass(frozen=True, slots=True)
class Gossip:
    sender: str
    updates: tuple[Update, ...] = ()


@dataclass(frozen=True, slots=True)
class PushPull:
    sender: str
    join: bool
    members: tuple[Record, ...]


Message = Union[Ping, Ack, PingReq, Nack, Gossip, PushPull]

#: wire name of each message type; HttpTransport serves each at /v1/membership/<name>
TYPE_NAMES: dict[type, str] = {Ping: "ping", Ack: "ack", PingReq: "ping-req", Nack: "nack",
                               Gossip: "gossip", PushPull: "push-pull"}
REQUEST_TYPES = ("ping", "ping-req", "gossip", "push-pull")


# --- encoding ------------------------------------------------------------------------------


def encode_update(u: Update) -> dict[str, Any]:
    if isinstance(u, Alive):
        return {"t": "alive", "n": u.node, "i": u.incarnation, "a": u.addr}
    if isinstance(u, Suspect):
        return {"t": "suspect", "n": u.node, "i": u.incarnation, "f": u.sender}
    if isinstance(u, Dead):
        return {"t": "dead", "n": u.node, "i": u.incarnation, "f": u.sender}
    if isinstance(u, Left):
        return {"t": "left", "n": u.node, "i": u.incarnation}
    raise TypeError(f"not a member update: {u!r}")


def encode_record(r: Record) -> dict[str, Any]:
    return {"n": r.node, "a": r.addr, "s": str(r.state), "i": r.incarnation}


def encode(msg: Message) -> dict[str, Any]:
    t = TYPE_NAMES[type(msg)]
    out: dict[str, Any] = {"v": VERSION, "t": t}
    if isinstance(msg, Ping):
        out.update(seq=msg.seq, f=msg.sender, a=msg.sender_addr, i=msg.sender_incarnation, target=msg.target)
    elif isinstance(msg, (Ack, Nack)):
        out.update(seq=msg.seq, f=msg.sender)
    elif isinstance(msg, PingReq):
        out.update(seq=msg.seq, f=msg.sender, target=msg.target, ta=msg.target_addr, timeout_ms=msg.timeout_ms)
    elif isinstance(msg, Gossip):
        out.update(f=msg.sender)
    elif isinstance(msg, PushPull):
        out.update(f=msg.sender, join=msg.join, m=[encode_record(r) for r in msg.members])
        return out
    out["u"] = [encode_update(u) for u in msg.updates]  # type: ignore[union-attr]
    return out


# --- strict decoding -----------------------------------------------------------------------


def _keys(where: str, obj: Any, required: set[str], optional: frozenset[str] = frozenset()) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise MessageError(f"{where}: expected a map, got {type(obj).__name__}")
    missing = required - obj.keys()
    if missing:
        raise MessageError(f"{where}: missing field(s) {', '.join(sorted(missing))}")
    unknown = obj.keys() - required - optional
    if unknown:
        raise MessageError(f"{where}: unknown field(s) {', '.join(sorted(map(str, unknown)))}")
    return obj


def _int(where: str, obj: dict[str, Any], key: str, low: int = 0, high: int = MAX_U64) -> int:
    value = obj[key]
    if type(value) is not int or not low <= value <= high:  # bool is not an int here
        raise MessageError(f"{where}: field {key!r} must be an integer in [{low}, {high}], got {value!r:.40}")
    return value


def _id(where: str, obj: dict[str, Any], key: str) -> str:
    value = obj[key]
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ID or not value.isprintable():
        raise MessageError(f"{where}: field {key!r} must be a printable node id of 1..{MAX_ID} characters")
    return value


def check_addr(value: Any, where: str = "addr") -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ADDR or not value.isprintable():
        raise MessageError(f"{where}: must be a HOST:PORT string of 1..{MAX_ADDR} characters")
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise MessageError(f"{where}: {value!r:.60} is not HOST:PORT")
    return value


def _addr(where: str, obj: dict[str, Any], key: str) -> str:
    return check_addr(obj[key], f"{where}: field {key!r}")


def _list(where: str, obj: dict[str, Any], key: str, limit: int) -> list[Any]:
    value = obj[key]
    if not isinstance(value, list) or len(value) > limit:
        raise MessageError(f"{where}: field {key!r} must be a list of at most {limit} items")
    return value


def decode_update(obj: Any) -> Update:
    if not isinstance(obj, dict) or not isinstance(obj.get("t"), str):
        raise MessageError("update: expected a map with a string field 't'")
    t = obj["t"]
    where = f"update {t!r:.20}"
    if t == "alive":
        _keys(where, obj, {"t", "n", "i", "a"})
        return Alive(_id(where, obj, "n"), _int(where, obj, "i", high=2**63 - 1), _addr(where, obj, "a"))
    if t == "suspect":
        _keys(where, obj, {"t", "n", "i", "f"})
        return Suspect(_id(where, obj, "n"), _int(where, obj, "i", high=2**63 - 1), _id(where, obj, "f"))
    if t == "dead":
        _keys(where, obj, {"t", "n", "i", "f"})
        return Dead(_id(where, obj, "n"), _int(where, obj, "i", high=2**63 - 1), _id(where, obj, "f"))
    if t == "left":
        _keys(where, obj, {"t", "n", "i"})
        return Left(_id(where, obj, "n"), _int(where, obj, "i", high=2**63 - 1))
    raise MessageError(f"update: unknown type {t!r:.40}")


def decode_record(obj: Any) -> Record:
    where = "push-pull member"
    _keys(where, obj, {"n", "a", "s", "i"})
    state = obj["s"]
    if state not in ("alive", "suspect", "dead", "left"):
        raise MessageError(f"{where}: field 's' must be alive, suspect, dead or left, got {state!r:.40}")
    return Record(_id(where, obj, "n"), _addr(where, obj, "a"), MemberState(state),
                  _int(where, obj, "i", high=2**63 - 1))


def _updates(where: str, obj: dict[str, Any]) -> tuple[Update, ...]:
    return tuple(decode_update(u) for u in _list(where, obj, "u", MAX_UPDATES))


def decode(obj: Any) -> Message:
    """Build a message from its decoded msgpack map; MessageError on anything else."""
    if not isinstance(obj, dict):
        raise MessageError(f"message: expected a map, got {type(obj).__name__}")
    if obj.get("v") != VERSION:
        raise MessageError(f"message: unsupported protocol version {obj.get('v')!r:.20} (expected {VERSION})")
    t = obj.get("t")
    where = f"{t!r:.20} message"
    if t == "ping":
        _keys(where, obj, {"v", "t", "seq", "f", "a", "i", "target", "u"})
        return Ping(_int(where, obj, "seq"), _id(where, obj, "f"), _addr(where, obj, "a"),
                    _int(where, obj, "i", high=2**63 - 1), _id(where, obj, "target"), _updates(where, obj))
    if t in ("ack", "nack"):
        _keys(where, obj, {"v", "t", "seq", "f", "u"})
        cls = Ack if t == "ack" else Nack
        return cls(_int(where, obj, "seq"), _id(where, obj, "f"), _updates(where, obj))
    if t == "ping-req":
        _keys(where, obj, {"v", "t", "seq", "f", "target", "ta", "timeout_ms", "u"})
        return PingReq(_int(where, obj, "seq"), _id(where, obj, "f"), _id(where, obj, "target"),
                       _addr(where, obj, "ta"), _int(where, obj, "timeout_ms", 1, MAX_TIMEOUT_MS),
                       _updates(where, obj))
    if t == "gossip":
        _keys(where, obj, {"v", "t", "f", "u"})
        return Gossip(_id(where, obj, "f"), _updates(where, obj))
    if t == "push-pull":
        _keys(where, obj, {"v", "t", "f", "join", "m"})
        if not isinstance(obj["join"], bool):
            raise MessageError(f"{where}: field 'join' must be a boolean")
        members = tuple(decode_record(r) for r in _list(where, obj, "m", MAX_RECORDS))
        return PushPull(_id(where, obj, "f"), obj["join"], members)
    raise MessageError(f"message: unknown type {t!r:.40}")
