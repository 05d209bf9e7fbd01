"""What a model payload holds, apart from its bytes: the model's tensors (``ModelSpec``), a
payload's header, the two kinds of payload (a whole ``Snapshot`` of the public copy x̂, a sparse
``Delta``), and the errors a refused payload raises.

Kept apart from the codec (codec.py turns these into bytes and back) because most of the
package only handles payloads: the worker builds them, replicas apply them, the daemon checks
their fingerprints, and none of it needs the wire format's details.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Union

import numpy as np

FORMAT_VERSION = 1
#: Element types a ModelSpec may declare -> dtype of the decoded arrays. Half-precision
#: parameters travel like float32 ones: the public copy x_hat is kept in float32 whatever the
#: model's type (its values go out as "vdt" says, and decode to float32), and averaging rounds
#: into the model's own type (numpy has no bfloat16; none is needed).
TENSOR_DTYPES: dict[str, np.dtype] = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float32),
                                      "bfloat16": np.dtype(np.float32)}

KINDS = ("snapshot", "delta")
#: "add": x̂[idx] += v (what the worker publishes); "set": x̂[idx] = v (merged deltas: exact).
DELTA_OPS = ("add", "set")


class PayloadError(ValueError):
    """A payload that must not be applied; the message is a short reason."""


class ArchitectureMismatch(PayloadError):
    """The payload describes another model (fingerprint or tensor specs differ)."""


def describe(fp: str) -> str:
    """A fingerprint in words: ``TASK@HASH`` (p2pnode.tasks.runtime.fingerprint) names its task."""
    task, sep, digest = fp.rpartition("@")
    return f"task {task!r} (model {digest})" if sep else f"model {fp!r}"


def mismatch(theirs: str, ours: str) -> str:
    """Why a payload of fingerprint ``theirs`` is refused by a node of fingerprint ``ours``."""
    if theirs.rpartition("@")[0] != ours.rpartition("@")[0]:
        return f"another task: the peer trains {describe(theirs)}, this node {describe(ours)}"
    return f"model fingerprint differs: the peer's {describe(theirs)}, this node's {describe(ours)}"


class NonFiniteError(PayloadError):
    """The payload carries NaN or infinity."""


@dataclass(frozen=True)
class TensorSpec:
    """Name, shape and element type of one floating-point tensor of the model."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass
class ModelSpec:
    """The tensors that travel on the wire, in state_dict order, plus the model fingerprint."""

    fingerprint: str
    tensors: list[TensorSpec]

    @property
    def numel(self) -> int:
        return sum(t.numel for t in self.tensors)

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.tensors]

    @classmethod
    def from_state_dict(cls, sd: Mapping[str, Any], fingerprint: str) -> ModelSpec:
        """Floating-point entries of a torch state_dict (integer buffers such as BatchNorm's
        ``num_batches_tracked`` are local bookkeeping and are not exchanged)."""
        specs = []
        for name, t in sd.items():
            if hasattr(t, "is_floating_point"):  # torch.Tensor
                if not t.is_floating_point():
                    continue
                dtype = str(t.dtype).removeprefix("torch.")
            else:
                a = np.asarray(t)
                if not np.issubdtype(a.dtype, np.floating):
                    continue
                dtype = a.dtype.name
            if dtype not in TENSOR_DTYPES:
                raise ValueError(f"{name}: dtype {dtype} is not supported on the wire")
            specs.append(TensorSpec(name, tuple(int(d) for d in t.shape), dtype))
        return cls(fingerprint, specs)

    def header(self, kind: str, node_id: str, epoch: str, version: int, **kw: Any) -> Header:
        """A header for a payload of this model (``kw``: base_version, step, loss, op)."""
        return Header(kind=kind, fingerprint=self.fingerprint, node_id=node_id, epoch=epoch,
                      version=version, specs=list(self.tensors), **kw)


@dataclass(kw_only=True)
class Header:
    """Everything in a payload except tensor data. ``base_version`` is -1 (or ``version``)
    for a snapshot; for a delta it is the version the delta applies to."""

    fmt: int = FORMAT_VERSION
    kind: str
    fingerprint: str
    node_id: str
    epoch: str
    base_version: int = -1
    version: int
    step: int = 0
    loss: float = 0.0  # NaN: unknown yet; never infinite
    specs: list[TensorSpec] = field(default_factory=list)
    op: str = "add"  # deltas only
    value_dtype: str = "float32"  # set by decode: how the values travelled


@dataclass
class Snapshot:
    """The whole x̂: one flat float32 array per tensor (decoded arrays may be read-only)."""

    header: Header
    tensors: dict[str, np.ndarray]


@dataclass
class Delta:
    """Sparse change: name -> (strictly increasing int64 indices into the flat tensor, float32
    values). Tensors without entries are unchanged."""

    header: Header
    entries: dict[str, tuple[np.ndarray, np.ndarray]]


Payload = Union[Snapshot, Delta]
