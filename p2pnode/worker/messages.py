"""Messages between the daemon and its training worker.

They cross a ``multiprocessing`` pipe as msgpack bytes (``send_bytes``), never pickles, so
both sides agree on a small explicit schema and encoded payloads pass through untouched.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import msgpack


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
    """Sent once the model is built: who we are now and x_hat as a full snapshot."""

    kind: ClassVar[str] = "hello"
    fingerprint: str
    epoch: str
    version: int
    step: int
    samples: int
    snapshot: bytes
    resumed: bool
    params: int


@dataclass
class Progress(Message):
    kind: ClassVar[str] = "progress"
    step: int
    samples: int
    loss: float
    done: bool  # reached training.max_samples; the worker now only averages and serves
    lr: float


@dataclass
class Published(Message):
    """A new version of x_hat: the encoded sparse delta q from version-1 to version."""

    kind: ClassVar[str] = "published"
    version: int
    delta: bytes


@dataclass
class Applied(Message):
    """The outcome of a peer payload: averaged in, or refused (nothing changed)."""

    kind: ClassVar[str] = "applied"
    token: int
    ok: bool
    peer: str
    epoch: str = ""
    version: int = -1
    reason: str = ""  # "malformed", "architecture", "non-finite", "gap", "too-large"
    detail: str = ""
    weight: float = 0.0


@dataclass
class Evaluated(Message):
    kind: ClassVar[str] = "evaluated"
    step: int
    accuracy: float
    loss: float
    samples: int


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

@dataclass
class PeerPayload(Message):
    kind: ClassVar[str] = "peer-payload"
    token: int
    peer: str
    data: bytes
    #: averaging weight of the peer; < 0 means "by the configured rule" (1.0 adopts its model)
    weight: float = -1.0


@dataclass
class Checkpoint(Message):
    kind: ClassVar[str] = "checkpoint"
    token: int


@dataclass
class Evaluate(Message):
    kind: ClassVar[str] = "evaluate"
    samples: int = 0


@dataclass
class Stop(Message):
    kind: ClassVar[str] = "stop"
    checkpoint: bool = True
    token: int = 0


def encode(msg: Message) -> bytes:
    body = dataclasses.asdict(msg)
    body["kind"] = msg.kind
    return msgpack.packb(body, use_bin_type=True)


def decode(data: bytes) -> Message:
    body = msgpack.unpackb(data, raw=False)
    cls = Message.registry.get(body.pop("kind", None))
    if cls is None:
        raise ValueError(f"unknown worker message {data[:40]!r}")
    return cls(**body)


