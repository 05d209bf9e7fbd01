"""The node's lasting identity in its state dir: a node id and an incarnation counter.

The id survives restarts so peers recognise a rejoining node; the incarnation goes up on every
start so that news of the new life beats news of the old one.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from pathlib import Path

from p2pnode.checkpoint import write_atomic

IDENTITY_FILE = "identity.json"


@dataclass
class Identity:
    node_id: str
    incarnation: int
    path: Path

    def save(self) -> None:
        write_atomic(self.path, json.dumps({"node_id": self.node_id, "incarnation": self.incarnation}).encode())

    def raise_to(self, incarnation: int) -> None:
        if incarnation > self.incarnation:
            self.incarnation = incarnation
            self.save()


def load_or_create(state_dir: Path) -> Identity:
    """Read the identity and bump its incarnation for this life; create one on first start."""
    path = state_dir / IDENTITY_FILE
    node_id, incarnation = secrets.token_hex(8), 0
    if path.exists():
        try:
            data = json.loads(path.read_text())
            node_id, incarnation = str(data["node_id"]), int(data["incarnation"]) + 1
        except (ValueError, KeyError, TypeError) as exc:
            raise RuntimeError(f"{path} is damaged ({exc}); move it away to start as a new node") from exc
    ident = Identity(node_id, incarnation, path)
    ident.save()
    return ident
