"""The training worker: a spawned subprocess that owns the model and does all tensor math.

Two implementations speak the same pipe protocol (``p2pnode/pipe_protocol.py``), chosen by
``training.worker``: ``"torch"`` (``main.py``, the real trainer) and ``"stub"`` (``stub.py``,
numpy only, for tests of membership, auth, TLS and lifecycle that need a real node but no
training). This module imports neither: the daemon names the implementation and the spawned
process imports it (:func:`run`), so the daemon never pays for torch on the worker's behalf.
"""

from __future__ import annotations

import importlib
import logging
import os
from multiprocessing.connection import Connection
from typing import Any

#: ``training.worker`` -> the module whose ``run(conn, cfg_dict, node_id)`` is the peer worker
#: (gossip's and the synchronous mode's; a mode may name its own: p2pnode/daemon/mode.py)
IMPLEMENTATIONS = {"torch": "p2pnode.worker.main", "stub": "p2pnode.worker.stub"}


def run(module: str, implementation: str, conn: Connection, cfg_dict: dict[str, Any], node_id: str) -> None:
    """Entry point of the spawned process: import ``module`` (the mode's worker, by name) there
    and run it. ``implementation`` is ``training.worker``, which the log lines say."""
    from p2pnode import logfmt

    # Logging first, in the daemon's format (text or json, p2pnode/logfmt.py): the
    # implementation's own basicConfig is then a no-op.
    tag = "worker" if implementation == "torch" else f"{implementation}-worker"
    logfmt.setup(cfg_dict.get("node", {}).get("log_level", "info"), cfg_dict.get("logging", {}).get("format", "text"),
                 "worker", f"%(asctime)s {tag} %(levelname)s %(message)s")
    logfmt.set_node(node_id)
    logging.getLogger("p2pnode.worker").info("worker process %d started (training.worker = %s)", os.getpid(),
                                             implementation)
    importlib.import_module(module).run(conn, cfg_dict, node_id)
