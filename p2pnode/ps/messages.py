"""Pipe messages of the parameter-server roles, added to the pipe protocol's registry.

They subclass :class:`p2pnode.pipe_protocol.Message`, so importing this module is what lets
``pipe_protocol.decode`` read them; both processes of a ``ps`` or ``ps-worker`` node import it.
Like every pipe message they travel as msgpack, never pickled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from p2pnode.pipe_protocol import Message


@dataclass
class PsGradient(Message):
    """ps-worker's worker -> daemon: one batch's encoded gradient, to push to the server.
    ``base_version`` is the server version the gradient was computed on."""

    kind: ClassVar[str] = "ps-gradient"
    step: int
    base_version: int
    data: bytes


@dataclass
class PsRoundEnd(Message):
    """ps-worker's daemon -> worker: the push and the pull of a round are over (the new
    weights, if any, came just before as a PeerPayload): compute the next gradient."""

    kind: ClassVar[str] = "ps-round-end"
    pushed: bool
    pulled: bool
    version: int = -1


@dataclass
class PsPush(Message):
    """ps server's daemon -> worker: a worker's pushed gradient to apply; answered by an
    ``Applied`` whose ``version`` is the server's model version after it."""

    kind: ClassVar[str] = "ps-push"
    token: int
    peer: str
    data: bytes
