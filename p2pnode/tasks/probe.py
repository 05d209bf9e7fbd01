"""The preflight probe of a task, run by ``p2pnode start`` in a subprocess before it joins.

``python -m p2pnode.tasks.probe`` reads the configuration (JSON) on stdin, loads the task as
the worker will (p2pnode/tasks/runtime.py), builds its model, draws one training batch and
computes its loss, then prints one JSON line: ``{"ok": true, "task": ..., "fingerprint": ...}``
or ``{"ok": false, "error": "task 'x': why"}``. It runs in its own process because the daemon
never imports torch (nor a user's module, which may do anything at import).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from p2pnode.config import Config, ConfigError


def probe(cfg: Config) -> dict[str, Any]:
    """Everything that can be checked of a task without training it."""
    import torch

    from p2pnode.data import DataError
    from p2pnode.tasks import loader, runtime
    from p2pnode.tasks.base import TaskError
    from p2pnode.tasks.registry import first_line
    from p2pnode.wire.payload import ModelSpec
    from p2pnode.worker.public import floating_state

    name = cfg.training.task or "builtin"
    try:
        loaded = runtime.load(cfg)
        name = loaded.label
        torch.manual_seed(cfg.training.seed)
        try:
            model = loaded.task.build_model().to(loaded.device)
        except Exception as exc:
            raise TaskError(f"build_model() raised {type(exc).__name__}: {first_line(exc)}") from None
        gen = torch.Generator().manual_seed(cfg.training.seed)
        batches = loader.train_batches(loaded.task, loaded.shard, cfg.training.batch_size, gen, 0)
        try:
            batch = loader.to_device(next(batches), loaded.device)
        except Exception as exc:
            raise TaskError(f"reading a training batch raised {type(exc).__name__}: {first_line(exc)}") from None
        model.train()
        try:
            loss = loaded.task.loss(model, batch)
        except Exception as exc:
            raise TaskError(f"loss() raised {type(exc).__name__}: {first_line(exc)}") from None
        runtime.check_loss(loss)
        try:  # what goes on the wire: float32 tensors only (p2pnode/wire/payload.py)
            ModelSpec.from_state_dict(floating_state(model), "probe")
        except ValueError as exc:
            raise TaskError(f"its model cannot go on the wire: {exc}") from None
        if not loss.requires_grad:
            raise TaskError("loss() returned a tensor without a gradient (computed under no_grad, or detached?)")
        return {"ok": True, "task": name, "fingerprint": runtime.fingerprint(name, model),
                "train_items": len(loaded.shard)}
    except TaskError as exc:
        text = str(exc)
        return {"ok": False, "error": text if text.startswith("task ") else f"task {name!r}: {text}"}
    except (DataError, ConfigError) as exc:
        return {"ok": False, "error": f"task {name!r}: {first_line(exc)}"}


def main() -> int:
    cfg = Config.from_dict(json.loads(sys.stdin.read()))
    result = probe(cfg)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
