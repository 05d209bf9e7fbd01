"""Model exchange on the wire: payload codec, the publisher's delta log, peers' replicas."""

from p2pnode.wire.codec import decode, encode
from p2pnode.wire.payload import (
    ArchitectureMismatch,
    Delta,
    Header,
    ModelSpec,
    NonFiniteError,
    PayloadError,
    Snapshot,
    TensorSpec,
)
from p2pnode.wire.replica import Replica, ReplicaCache, ReplicaGap
from p2pnode.wire.served import ServedModel, ServeResult

__all__ = [
    "ArchitectureMismatch", "Delta", "Header", "ModelSpec", "NonFiniteError", "PayloadError",
    "Snapshot", "TensorSpec", "decode", "encode", "ServedModel", "ServeResult", "Replica",
    "ReplicaCache", "ReplicaGap",
]
