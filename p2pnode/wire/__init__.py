"""Model exchange on the wire: payload codec, the publisher's delta log, peers' replicas."""

from p2pnode.wire.codec import (
    ArchitectureMismatch,
    Delta,
    Header,
    ModelSpec,
    NonFiniteError,
    PayloadError,
    Snapshot,
    TensorSpec,
    decode,
    encode,
)
from p2pnode.wire.publisher import PublicModel, ServeResult
from p2pnode.wire.replica import Replica, ReplicaCache, ReplicaGap

__all__ = [
    "ArchitectureMismatch", "Delta", "Header", "ModelSpec", "NonFiniteError", "PayloadError",
    "Snapshot", "TensorSpec", "decode", "encode", "PublicModel", "ServeResult", "Replica",
    "ReplicaCache", "ReplicaGap",
]
