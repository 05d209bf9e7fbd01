"""The daemon's overhead on training: the real worker with no daemon ("bare") against a real
``p2pnode start`` whose daemon serves emulated peers ("served"), CPU of every process measured.

* ``BareWorker``: ``p2pnode.worker.main.run`` spawned exactly as the daemon spawns it (same
  entry point, same config file, same allocator settings); its pipe is read by a thread here
  that only notes the worker's progress. This is the real worker code path, publishing included.
* ``ServedNode``: a ``p2pnode start`` process (its own spawned worker) and ``benchlib.puller``
  processes pulling its model: ``idle`` (nobody pulls), ``flood`` (back to back), ``paced``
  (one pull per interval each).
* ``measure(edge, roles, window)``: one window spanning whole steps, with the CPU each role's
  processes used, the machine's, and the worker's page faults.

Every setup stays alive for the whole run and is frozen (SIGSTOP) while another is measured.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchlib.cluster import NodeProc
from benchlib.procs import (
    check_pinned,
    cpu_seconds,
    machine_busy,
    minor_faults,
    worker_pid,
)
from benchlib.status import get_json, wait_for

BATCH = 64
#: (seconds, samples) right after the worker's samples counter moved
Edge = Callable[[], tuple[float, int]]


def taskset(cpus: set[int] | None) -> list[str]:
    """Command prefix pinning a process (and all it starts) to ``cpus``; none when unpinned."""
    return ["taskset", "-c", ",".join(map(str, sorted(cpus)))] if cpus else []


def write_config(path: Path, sets: list[str]) -> dict[str, Any]:
    """Freeze a node config (this tree's defaults + ``sets``) into a TOML file that the bare
    worker and the daemon both load: later edits of the defaults cannot make them differ."""
    from p2pnode.config import Config, set_option, validate

    cfg = Config()
    for item in sets:
        key, _, value = item.partition("=")
        set_option(cfg, key.strip(), value.strip())
    validate(cfg)
    d = cfg.to_dict()
    path.write_text("\n".join(f"[{sec}]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in vals.items())
                              for sec, vals in d.items()))
    return d


def _edge_of(read: Callable[[], int], limit: float = 1.0) -> tuple[float, int]:
    first = read()
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if (s := read()) != first:
            return time.monotonic(), s
        time.sleep(0.005)
    return time.monotonic(), read()


@contextmanager
def _inherited(env: dict[str, str], cpus: set[int] | None) -> Iterator[None]:
    """A spawned process inherits our environment and CPU affinity: set both while it starts."""
    saved_env = {k: os.environ.get(k) for k in env}
    saved_cpus = os.sched_getaffinity(0)
    os.environ.update(env)
    if cpus:
        os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        os.sched_setaffinity(0, saved_cpus)


class BareWorker:
    """The real training worker alone: no daemon, no HTTP, its pipe drained here."""

    def __init__(self, config: Path, env: dict[str, str], cpus: set[int] | None) -> None:
        from p2pnode.config import Config, load_file
        from p2pnode.worker.main import run

        self.state = Path(tempfile.mkdtemp(prefix="bench-bare-"))
        cfg = Config.from_dict(load_file(config))
        cfg.node.state_dir = str(self.state)
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=run, args=(child, cfg.to_dict(), "bare"), name="bare-worker", daemon=True)
        with _inherited(env, cpus):
            self.proc.start()
        child.close()
        self.samples = 0
        self.failed = ""
        threading.Thread(target=self._read, daemon=True).start()
        wait_for(lambda: self.failed or self.samples >= 5 * BATCH, 180, "the bare worker to train")
        if self.failed:
            raise RuntimeError(f"the bare worker cannot train: {self.failed}")
        assert self.proc.pid is not None
        self.pid = self.proc.pid
        check_pinned("bare worker", self.pid, cpus)

    def _read(self) -> None:
        from p2pnode.pipe_protocol import Failed, Progress, decode

        while True:
            try:
                msg = decode(self.conn.recv_bytes())
            except (EOFError, OSError):
                return
            if isinstance(msg, Progress):
                self.samples = msg.samples
            elif isinstance(msg, Failed):
                self.failed = msg.detail

    def edge(self) -> tuple[float, int]:
        return _edge_of(lambda: self.samples)

    def pause(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def close(self) -> None:
        """Stop the worker as the daemon does (its answer and exit end the reader thread)."""
        from p2pnode.pipe_protocol import Stop, encode

        self.resume()
        try:
            self.conn.send_bytes(encode(Stop(checkpoint=False)))
        except OSError:
            pass
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.conn.close()
        shutil.rmtree(self.state, ignore_errors=True)


class PullerProcs:
    """``loops`` emulated peers in ``procs`` processes (``benchlib.puller``), driven line by line."""

    def __init__(self, addr: str, loops: int, procs: int, env: dict[str, str], cpus: set[int] | None) -> None:
        per = [loops // procs + (1 if i < loops % procs else 0) for i in range(procs)]
        self.procs = [subprocess.Popen([*taskset(cpus), sys.executable, "-m", "benchlib.puller", "--addr", addr,
                                        "--loops", str(n)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       text=True, bufsize=1, env=env) for n in per if n]
        for p in self.procs:
            self._reply(p)

    @staticmethod
    def _reply(p: subprocess.Popen[str]) -> dict[str, Any]:
        assert p.stdout is not None
        line = p.stdout.readline()
        if not line:
            raise RuntimeError(f"puller {p.pid} died (exit code {p.poll()})")
        reply: dict[str, Any] = json.loads(line)
        return reply

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def send(self, cmd: str) -> list[dict[str, Any]]:
        for p in self.procs:
            assert p.stdin is not None
            p.stdin.write(cmd + "\n")
            p.stdin.flush()
        return [self._reply(p) for p in self.procs]

    def close(self) -> None:
        for p in self.procs:
            if p.stdin is not None:
                p.stdin.close()
        for p in self.procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


class ServedNode:
    """A real daemon (and its worker) on a free loopback port, with its pullers."""

    def __init__(self, config: Path, root: Path, name: str, env: dict[str, str], node_cpus: set[int] | None,
                 peer_cpus: set[int] | None, loops: int, puller_procs: int) -> None:
        self.node = NodeProc(root, name, ["--config", str(config)], prefix=taskset(node_cpus), env=env).start()
        wait_for(lambda: (t := self.node.status()["training"])["worker_alive"] and t["samples"] >= 5 * BATCH
                 or self.node.proc is None or self.node.proc.poll() is not None, 180, f"{name} to train")
        if self.node.proc is None or self.node.proc.poll() is not None:
            raise RuntimeError(f"{name} exited; see {self.node.log_path}")
        self.worker = worker_pid(self.node.pid)
        check_pinned(f"{name} daemon", self.node.pid, node_cpus)
        check_pinned(f"{name} worker", self.worker, node_cpus)
        self.pullers = PullerProcs(self.node.addr, loops, puller_procs, env, peer_cpus)

    def edge(self) -> tuple[float, int]:
        return _edge_of(lambda: int(get_json(self.node.addr)["training"]["samples"]))

    def pause(self) -> None:
        """SIGSTOP the worker, then the daemon (a stopped daemon would block the worker's pipe)."""
        os.kill(self.worker, signal.SIGSTOP)
        os.kill(self.node.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.node.pid, signal.SIGCONT)
        os.kill(self.worker, signal.SIGCONT)

    def close(self) -> None:
        self.pullers.close()
        self.node.stop(15.0)


def measure(edge: Edge, roles: dict[str, list[int]], fault_pid: int, window: float) -> dict[str, Any]:
    """Samples/s over about ``window`` seconds starting and ending right after a step; cores in
    use per role (CPU seconds per second) and by everybody else on the machine (``others``);
    the worker's (``fault_pid``'s) minor page faults per step."""
    me = os.getpid()

    def cpu() -> dict[str, float]:
        out = {role: sum(map(cpu_seconds, pids)) for role, pids in roles.items()}
        out["_me"], out["_busy"] = cpu_seconds(me), machine_busy()
        return out

    t0, s0 = edge()
    c0, f0 = cpu(), minor_faults(fault_pid)
    time.sleep(max(0.0, window - 0.05))
    t1, s1 = edge()
    c1, f1 = cpu(), minor_faults(fault_pid)
    sec = t1 - t0
    used = {k: (c1[k] - c0[k]) / sec for k in c0}
    steps = (s1 - s0) / BATCH
    return {"seconds": sec, "sps": (s1 - s0) / sec, "steps": steps, "faults_per_step": (f1 - f0) / max(steps, 1),
            "cpu": {k: v for k, v in used.items() if not k.startswith("_")},
            "others_cpu": max(0.0, used["_busy"] - sum(v for k, v in used.items() if k != "_busy"))}
