"""A pushed gradient on the wire: a model payload (``p2pnode/wire/codec.py``, ``payload.py``) of kind "delta".

Reusing the model codec gives the push the same validation, size limits and fingerprint check
as a model exchange, and lets the server's guard refuse garbage from a body's first bytes
(``wire/prefix.py``). Only the non-zero entries travel (a masked or top-k gradient is sparse;
a dense one costs 4 bytes a value plus indices that the codec delta-codes to almost nothing).
``base_version`` is the server version the gradient was computed on (``version`` is base + 1),
so the server can tell how stale a push is.

Floating-point buffers (BatchNorm statistics) have no gradient: a worker sends how its forward
pass moved them, and the server adds that, so the served model's statistics follow training.
Torch is imported: only worker processes use this module.
"""

from __future__ import annotations

import numpy as np
import torch

from p2pnode.wire.codec import decode, encode
from p2pnode.wire.payload import Delta, ModelSpec, PayloadError
from p2pnode.wire.rounding import round_for_wire


def encode_gradient(changes: dict[str, torch.Tensor], spec: ModelSpec, node_id: str, epoch: str,
                    base_version: int, step: int, loss: float, value_dtype: str = "float32") -> bytes:
    """``changes``: name -> gradient (parameters) or buffer change (buffers); names not in it send nothing."""
    entries: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name in spec.names:
        change = changes.get(name)
        if change is None:
            continue
        flat = change.detach().reshape(-1).float().cpu()
        idx = torch.nonzero(flat, as_tuple=False).reshape(-1)
        if idx.numel() == 0:
            continue
        idx_np, values = idx.numpy(), flat[idx].numpy()
        if value_dtype == "int8":  # the encoder takes only rounded int8 values (no x_hat here)
            idx_np, values = round_for_wire(idx_np, values, value_dtype)
            if idx_np.size == 0:
                continue
        entries[name] = (idx_np.astype(np.uint32), values)
    base = max(0, base_version)
    header = spec.header("delta", node_id, epoch, base + 1, base_version=base, step=step,
                         loss=loss if np.isfinite(loss) else -1.0)
    return encode(Delta(header, entries), value_dtype=value_dtype)


def decode_gradient(data: bytes, spec: ModelSpec, max_bytes: int) -> Delta:
    """The pushed gradient in ``data``; PayloadError (or a subclass) for anything else."""
    payload = decode(data, spec, max_bytes)
    if not isinstance(payload, Delta) or payload.header.op != "add":
        raise PayloadError("a gradient push is an additive delta, not a snapshot")
    return payload


def dense(delta: Delta, name: str, like: torch.Tensor) -> torch.Tensor | None:
    """Entry ``name`` of ``delta`` as a dense tensor shaped like ``like`` (None: not in it)."""
    entry = delta.entries.get(name)
    if entry is None:
        return None
    idx, values = entry
    out = torch.zeros(like.numel(), dtype=torch.float32)
    out[torch.from_numpy(idx.astype(np.int64))] = torch.from_numpy(np.array(values, dtype=np.float32))
    return out.view_as(like).to(device=like.device, dtype=like.dtype)
