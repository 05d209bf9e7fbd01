"""The synchronous mode's hostile member, for benchmarks: imported at start-up (as Python imports
any ``sitecustomize`` on its path) by the processes of the one node ``benchlib.poison.
train_sync_attacked`` puts this folder on the ``PYTHONPATH`` of. Once its worker imports
``p2pnode.sync.worker_powersgd``, every contribution the worker makes to a phase is its honest one times
``P2P_SYNC_ATTACK`` (say −100: the gradient's factors negated and scaled up), well formed on the
wire in every other way. Its own error feedback still sees the honest values, so the attack
holds steady rather than blowing up to values the reducer would refuse as non-finite.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any

SCALE = float(os.environ.get("P2P_SYNC_ATTACK", "-100"))
TARGET = "p2pnode.sync.worker_powersgd"


def _patch(module: ModuleType) -> None:
    from p2pnode.sync.values import decode, encode

    cls = module.PowerSync
    for name in ("phase0", "phase1"):
        honest = getattr(cls, name)

        def hostile(self: Any, *args: Any, _honest: Any = honest, **kwargs: Any) -> bytes:
            data = _honest(self, *args, **kwargs)
            return encode(decode(data, self.values) * SCALE, self.values)

        setattr(cls, name, hostile)


class _Finder(importlib.abc.MetaPathFinder):
    """Patches TARGET right after it is first executed, wherever it is imported from."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            _patch(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


sys.meta_path.insert(0, _Finder())
