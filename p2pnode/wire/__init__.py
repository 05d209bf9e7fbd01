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

__all__ = [
    "ArchitectureMismatch", "Delta", "Header", "ModelSpec", "NonFiniteError", "PayloadError",
    "Snapshot", "TensorSpec", "decode", "encode",
]
