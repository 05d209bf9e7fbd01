"""A node's *genesis*: its public model x̂ at version 0, before any publish.

Every fresh node builds the same initial model from ``training.seed``, so every fresh node's
version 0 is the same tensors. A peer's first fetch need not then cross the wire whole (a
float32 snapshot: 1.7 MB for the small CNN, 45 MB for resnet18, per peer): the asker names its
own genesis by digest (``GET /v1/model?since=0&genesis=D``), and a server whose version 0 has
the same digest answers with the delta from version 0, as to any replica at version 0. The
asker's worker starts that peer's replica from its own genesis copy and applies the delta: the
replica is bit-equal to the peer's x̂, as after a snapshot. A resumed node (its x̂ is not at
version 0) has no genesis and is asked with a snapshot, as before; different seeds, models or
initialisations give different digests, and a snapshot.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping

import numpy as np

from p2pnode.wire.payload import ModelSpec

#: what a digest looks like on the wire (``?genesis=``): lowercase hex, 32 characters
DIGEST_RE = re.compile(r"[0-9a-f]{32}")


def digest(arrays: Mapping[str, np.ndarray], spec: ModelSpec) -> str:
    """SHA-256 of the tensors' float32 bytes in the spec's order, with their names and sizes
    (two specs that differ never share a digest): the first 32 hex characters."""
    h = hashlib.sha256(spec.fingerprint.encode())
    for t in spec.tensors:
        a = np.ascontiguousarray(arrays[t.name], dtype="<f4").reshape(-1)
        if a.size != t.numel:
            raise ValueError(f"tensor {t.name}: {a.size} values, the spec says {t.numel}")
        h.update(f"{t.name}:{t.numel};".encode())
        h.update(a.data.cast("B"))  # no copy; hashlib lets go of the GIL over a big buffer
    return h.hexdigest()[:32]
