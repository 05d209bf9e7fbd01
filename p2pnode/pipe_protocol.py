"""The pipe protocol: every message between the daemon and its training worker.

Both processes own this module (neither imports the other's code to talk): the daemon
(``p2pnode/daemon/``) and the worker (``p2pnode/worker/main.py``) encode and decode with it. The
messages cross a ``multiprocessing`` pipe as msgpack bytes (``send_bytes``), never pickles, so
both sides agree on a small explicit schema and encoded model payloads pass through untouched.
It imports neither torch nor anything of the daemon's, so a torch-free worker can speak it too.
"""

from __future__ import annotations

import dataclasses
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, ClassVar, Final, Literal

import msgpack

from p2pnode.wire.msgview import big_buffer

#: How the worker takes a peer's model (``PeerPayload.mode``): "average" weighs it in by the
#: configured rule (``exchange.averaging``); "adopt" replaces ours with it (a fresh node's
#: bootstrap from its first peer).
AVERAGE: Final = "average"
ADOPT: Final = "adopt"
PeerMode = Literal["average", "adopt"]

#: Why the worker refused a peer payload (``Applied.reason``). "gap" is ours, not the peer's:
#: we hold no replica (or another version) to apply its delta to and must ask for a snapshot.
GAP: Final = "gap"
#: "outlier": robust averaging (exchange.robust) found the model too far from ours to average.
OUTLIER: Final = "outlier"
REFUSAL_REASONS = ("malformed", "architecture", "non-finite", GAP, "too-large", OUTLIER)


@dataclass
class Message:
    kind: ClassVar[str] = ""
    registry: ClassVar[dict[str, type[Message]]] = {}

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        Message.registry[cls.kind] = cls


# --- worker -> daemon -------------------------------------------------------------------

@dataclass
class Hello(Message):
    """Sent once the model is built: who we are now and x_hat as a full snapshot. A new
    ``epoch`` means a new worker life: every replica it held of its peers is gone."""

    kind: ClassVar[str] = "hello"
    fingerprint: str
    epoch: str
    version: int
    step: int
    samples: int
    snapshot: bytes
    resumed: bool
    params: int
    #: training samples per class in this node's shard (its partition), for status
    classes: list[int] = dataclasses.field(default_factory=list)
    #: BatchNorm layers in the model (0: none): gossip's default sparse copies suit such a model
    #: badly, and the daemon says so (supervisor.py)
    batchnorm: int = 0
    #: a big model's x_hat is this file (wire/public_file.py), read by the daemon to serve it;
    #: ``snapshot`` is then empty
    public_file: str = ""
    #: with ``public_file`` at version 0: the digest of x_hat then (wire/genesis.py)
    genesis: str = ""
    #: the optimizer's class name, and whether it adapts each coordinate's step (AdamW...): in
    #: gossip such a cluster learns barely better than a node alone; status says so (mode_rule.py)
    optimizer: str = ""
    adaptive: bool = False


@dataclass
class Progress(Message):
    kind: ClassVar[str] = "progress"
    step: int
    samples: int
    loss: float
    done: bool  # reached training.max_samples; the worker now only averages and serves
    lr: float  # the step size now (a divergence halves it for a while)
    #: non-finite losses seen so far (each restored the model and halved the step size)
    nonfinite: int = 0
    #: the part of each batch trained on (exchange.sync_keep_pace: under 1 on a node slower
    #: than the others)
    batch_share: float = 1.0


@dataclass
class Published(Message):
    """A new version of x_hat: the encoded sparse delta q from version-1 to version."""

    kind: ClassVar[str] = "published"
    version: int
    #: the worker sends it in parts (``Parts``: not joined first); the daemon reads one buffer
    delta: bytes | Parts


@dataclass
class Applied(Message):
    """The outcome of a peer payload: averaged in, or refused (nothing changed)."""

    kind: ClassVar[str] = "applied"
    token: int
    ok: bool
    peer: str
    epoch: str = ""
    version: int = -1
    reason: str = ""  # one of REFUSAL_REASONS when not ok
    detail: str = ""
    weight: float = 0.0
    #: ||x - x_hat_peer|| / ||x|| just before averaging (-1: not measured): how far apart we were
    distance: float = -1.0
    #: robust averaging (exchange.robust = "clip"): the radius tau relative to ||x|| (-1: not
    #: clipping), and whether this exchange was clipped to it (``weight`` is then the smaller one)
    radius: float = -1.0
    clipped: bool = False
    #: averaged under the spread rule: the typical peer was as far, so a model beyond the
    #: refusal bound was clipped instead of refused (robust.py)
    spread: bool = False


@dataclass
class Evaluated(Message):
    """Test-set figures, sent every ``training.eval_every`` steps, once at the end of training,
    and when the daemon asks (``Evaluate``)."""

    kind: ClassVar[str] = "evaluated"
    step: int
    accuracy: float  # NaN: the task reports no accuracy
    loss: float
    samples: int
    #: every metric the task reported (p2pnode/tasks/: loss, accuracy, perplexity...)
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    #: the model the consensus finish agreed on (an ``Evaluate(consensus=True)`` answered)
    consensus: bool = False
    #: with ``consensus``: the agreed model was worse than ours before the finish, so we went
    #: back to ours (worker/finish_guard.py); these figures are of our own model
    kept_own: bool = False


@dataclass
class Checkpointed(Message):
    kind: ClassVar[str] = "checkpointed"
    token: int
    step: int
    path: str
    ok: bool = True
    detail: str = ""


@dataclass
class Failed(Message):
    """The worker cannot go on (bad data folder, bad checkpoint): the daemon shuts down."""

    kind: ClassVar[str] = "failed"
    detail: str


# --- daemon -> worker -------------------------------------------------------------------

def mean_weight(nth: int) -> float:
    """The weight of a round's ``nth`` payload under the "mean" rule: 1/(n+1), so the k payloads
    of one round leave the plain mean of k+1 models (torch worker and stub alike)."""
    return 1.0 / (nth + 1)


@dataclass
class PeerPayload(Message):
    """A peer's model payload (snapshot or delta, as fetched) to apply to its replica and
    take in as ``mode`` says."""

    kind: ClassVar[str] = "peer-payload"
    token: int
    peer: str
    data: bytes | bytearray | memoryview  #: a memoryview when big: read in one piece from the pipe
    mode: PeerMode = "average"
    #: its place among this round's payloads (exchange.peers_per_round): the n-th is averaged in
    #: with weight 1/(n+1) under the "mean" rule, so a round of k peers ends at the plain mean
    #: of k+1 models instead of weighting the last to land by 1/2 and our own model by 1/2^k
    nth: int = 1
    #: the answer to a first fetch that named our genesis (wire/genesis.py): a delta from version
    #: 0 may start the peer's replica from our own version 0, which the peer's was found equal to
    genesis: bool = False
    #: a big payload the daemon spooled to a file as it arrived (net/spool.py): the worker reads
    #: it from there (wire/mapped.py) and ``data`` is empty; the daemon removes the file once
    #: answered
    path: str = ""

    def __post_init__(self) -> None:
        if self.mode not in (AVERAGE, ADOPT):
            raise ValueError(f"unknown peer payload mode {self.mode!r}")
        if not isinstance(self.nth, int) or self.nth < 1:
            raise ValueError(f"a payload's place in its round must be 1 or more, not {self.nth!r}")


@dataclass
class Checkpoint(Message):
    kind: ClassVar[str] = "checkpoint"
    token: int


@dataclass
class Stop(Message):
    kind: ClassVar[str] = "stop"
    checkpoint: bool = True
    token: int = 0


@dataclass
class Begin(Message):
    """Training may start: the daemon saw ``training.min_peers`` peers, or membership settled
    (``training.start_settle``), or it waited long enough (daemon/start_gate.py). A fresh worker
    with either set takes no step before it; sent after every hello."""

    kind: ClassVar[str] = "begin"


@dataclass
class Hold(Message):
    """exchange.max_lead: take no step at or beyond ``limit`` (-1: no bound) until told
    otherwise; the node is that far ahead of its peers (exchange/pace.py)."""

    kind: ClassVar[str] = "hold"
    limit: int = -1


@dataclass
class PublishNow(Message):
    """A peer is fetching our model (``compression.publish_on = "fetch"``): publish what changed
    before the next step, so it gets our model as it is, not as it was a few steps ago. The
    worker publishes at most once a step; a request with nothing new since is dropped."""

    kind: ClassVar[str] = "publish_now"


@dataclass
class Evaluate(Message):
    """Evaluate the model now, on the whole test set. The daemon asks when the consensus
    finish reaches agreement: the figure sent at the end of training is of the model before
    the averages that followed it, not of the model every node ends with (docs/ALGORITHMS.md,
    "Consensus finish")."""

    kind: ClassVar[str] = "evaluate"
    consensus: bool = True


#: compression.publish_on = "fetch": a copy nobody fetched for this many x publish_every steps is
#: published anyway (peers that refuse it as an outlier, e.g. a node resumed from an old
#: checkpoint, seldom fetch it: it must still move as the model comes back towards theirs)
FETCH_FALLBACK = 4


#: The messages that carry a token and are answered by one (Applied or Checkpointed).
Request = PeerPayload | Checkpoint | Stop


def encode(msg: Message) -> bytes:
    body = dataclasses.asdict(msg)
    body["kind"] = msg.kind
    return msgpack.packb(body, use_bin_type=True)


#: bytes fields this long or longer cross the pipe after their message as raw frames (``send``,
#: ``receive``): a model payload is never copied into a msgpack message on one side nor out of
#: one on the other, and the reader fills a single buffer of the announced size
BIG_FIELD = 1 << 20
FRAME_BYTES = 1 << 20  # multiprocessing copies each frame once holding the GIL: keep that short
TRAILERS = "_trailers"


class Parts(tuple):  # type: ignore[type-arg]
    """A bytes field given as the parts of its value, in order (a payload encoded in parts,
    wire/codec.py ``delta_parts``): sent as if they were joined, without joining them; the
    reader gets one buffer, as for any bytes field."""

    @property
    def nbytes(self) -> int:
        return sum(memoryview(p).nbytes for p in self)


def joined(value: bytes | bytearray | memoryview | Parts) -> bytes | bytearray | memoryview:
    """A bytes field as one buffer: what ``receive`` gives already; :class:`Parts` (a message
    handed over in-process, not through a pipe) joined."""
    return b"".join(value) if isinstance(value, Parts) else value


def _frames(value: bytes | bytearray | memoryview | Parts) -> Iterator[memoryview | bytes]:
    """A big field's frames: slices of ``FRAME_BYTES`` at most, small parts gathered into one."""
    small = bytearray()
    for part in (value if isinstance(value, Parts) else (value,)):
        view = memoryview(part).cast("B")
        if view.nbytes < 64 << 10:
            small += view
            if len(small) < 64 << 10:
                continue
            view, small = memoryview(bytes(small)), bytearray()
        elif small:
            yield bytes(small)
            small = bytearray()
        for at in range(0, view.nbytes, FRAME_BYTES):
            yield view[at:at + FRAME_BYTES]
    if small:
        yield bytes(small)


def send(conn: Connection, msg: Message) -> None:
    """Write ``msg`` to ``conn`` (blocking): small fields in one msgpack message, every bytes
    field (or :class:`Parts`) of ``BIG_FIELD`` or more after it in frames of ``FRAME_BYTES`` at
    most (its name and length announced in the message's ``_trailers``)."""
    body: dict[str, Any] = {f.name: getattr(msg, f.name) for f in dataclasses.fields(msg)}
    for k, v in body.items():
        if isinstance(v, Parts) and v.nbytes < BIG_FIELD:
            body[k] = b"".join(v)
    sizes = {k: v.nbytes if isinstance(v, Parts) else memoryview(v).nbytes for k, v in body.items()
             if isinstance(v, (Parts, bytes, bytearray, memoryview))}
    big = [(k, body[k], size) for k, size in sizes.items() if size >= BIG_FIELD]
    for name, _, _ in big:
        body[name] = b""
    if big:
        body[TRAILERS] = [[name, size] for name, _, size in big]
    body["kind"] = msg.kind
    conn.send_bytes(msgpack.packb(body, use_bin_type=True))
    for _, value, _ in big:
        for frame in _frames(value):
            conn.send_bytes(frame)


def receive(conn: Connection) -> Message:
    """The next message from ``conn`` (blocking), its big fields read into one buffer each (a
    memoryview of ``big_buffer``); ValueError for anything that is not one of ours (EOFError,
    OSError: the pipe is closed)."""
    data = conn.recv_bytes()
    body = _unpack(data)
    trailers = body.pop(TRAILERS, None)
    if trailers is not None:
        if not isinstance(trailers, list) or not all(
                isinstance(t, list) and len(t) == 2 and isinstance(t[0], str) and type(t[1]) is int and t[1] >= 0
                for t in trailers):
            raise ValueError("bad trailers in a pipe message")
        for name, size in trailers:
            buf = big_buffer(size)
            at = 0
            while at < size:
                at += _frame_into(conn, buf, at)
            if at != size:
                raise ValueError(f"pipe message field {name!r}: {at} bytes, {size} announced")
            body[name] = buf
    return _message(body, data)


def _read_exact(fd: int, n: int) -> bytes:
    out = b""
    while len(out) < n:
        got = os.read(fd, n - len(out))
        if not got:
            raise EOFError("pipe closed")
        out += got
    return out


def _frame_into(conn: Connection, buf: memoryview, at: int) -> int:
    """One frame that ``Connection.send_bytes`` wrote (a 4-byte big-endian length, or -1 and
    an 8-byte one, then the bytes), read straight into ``buf`` from ``at`` with ``os.readv``,
    which lets go of the GIL. ``recv_bytes_into`` reads it into a BytesIO and copies it
    twice holding the GIL (in a daemon exchanging a 124M-parameter model, about half a second
    of GIL time over two minutes, taken from the event loop). Returns the frame's length."""
    fd = conn.fileno()
    (n,) = struct.unpack("!i", _read_exact(fd, 4))
    if n == -1:
        (n,) = struct.unpack("!Q", _read_exact(fd, 8))
    if n < 0 or at + n > buf.nbytes:
        raise ValueError(f"pipe frame of {n} bytes past its field's {buf.nbytes - at} left")
    end = at + n
    while at < end:
        got = os.readv(fd, [buf[at:end]])
        if got == 0:
            raise EOFError("pipe closed in a frame")
        at += got
    return n


def decode(data: bytes) -> Message:
    """The message in ``data``; ValueError for anything that is not one of ours."""
    return _message(_unpack(data), data)


def _unpack(data: bytes) -> dict[str, Any]:
    try:
        body = msgpack.unpackb(data, raw=False)
    except ValueError as exc:  # msgpack's format errors are ValueErrors
        raise ValueError(f"undecodable pipe message {data[:40]!r}: {exc}") from exc
    if not isinstance(body, dict):
        raise ValueError(f"pipe message is not a map: {data[:40]!r}")  # noqa: TRY004 - one error type for bad input
    return body


def _message(body: dict[str, Any], data: bytes) -> Message:
    cls = Message.registry.get(body.pop("kind", None))
    if cls is None:
        raise ValueError(f"unknown pipe message {data[:40]!r}")
    try:
        return cls(**body)
    except TypeError as exc:
        raise ValueError(f"bad {cls.kind} message: {exc}") from exc
