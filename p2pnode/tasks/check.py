"""``p2pnode start``'s check of a named task, before it joins a cluster (torch-free).

The daemon never imports torch nor a user's task module, so the task is loaded, built and
tried on one batch by a short-lived subprocess (:mod:`p2pnode.tasks.probe`); what it reports
wrong becomes one :class:`~p2pnode.config.ConfigError` line, and the CLI exits 2 (a cause no
restart can fix: systemd's ``RestartPreventExitStatus=2``). The built-in task (an empty
``training.task``) is not probed: :func:`p2pnode.preflight.check_data` checks its files, and
its worker reports the rest, as before tasks existed.
"""

from __future__ import annotations

import json
import subprocess
import sys

from p2pnode.config import Config, ConfigError

#: seconds the probe may take (importing torch and a task, scanning a data folder)
PROBE_TIMEOUT = 300.0


def check_task(cfg: Config, timeout: float = PROBE_TIMEOUT) -> None:
    """Raise ConfigError naming the task and the cause when ``training.task`` cannot train."""
    t = cfg.training
    if t.worker != "torch" or not t.task:
        return
    try:
        proc = subprocess.run([sys.executable, "-m", "p2pnode.tasks.probe"], input=json.dumps(cfg.to_dict()),
                              capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise ConfigError(f"training.task: task {t.task!r}: not ready after {timeout:.0f} s "
                          "(the probe was stopped)") from None
    lines = proc.stdout.strip().splitlines()
    try:
        result = json.loads(lines[-1]) if lines else None
    except ValueError:
        result = None
    if not isinstance(result, dict):
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]
        raise ConfigError(f"training.task: task {t.task!r}: the probe failed (exit {proc.returncode}): {tail}")
    if not result.get("ok"):
        raise ConfigError(f"training.task: {result.get('error', 'unknown error')}")
