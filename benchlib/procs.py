"""Processes seen from ``/proc``: CPU time, page faults, children, CPU pinning, and stopping one.

Benchmarks read CPU figures of the processes they start; tests find a daemon's training worker
and check it is gone. Linux only (``/proc``), like the daemon's deployment target.
"""

from __future__ import annotations

import os
import platform
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of ``/proc/PID/stat`` after the command name (field 3 is index 0); None if gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rindex(")") + 2:].split()


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system, all threads) a live process has used; 0.0 once it is gone."""
    fields = _stat_fields(pid)
    return 0.0 if fields is None else (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def minor_faults(pid: int) -> int:
    """Minor page faults so far: glibc handing big blocks back to the kernel and taking them
    again shows up here (and as system time), and swings a training step's time."""
    fields = _stat_fields(pid)
    return 0 if fields is None else int(fields[7])  # minflt


def machine_busy() -> float:
    """CPU seconds the whole machine has been busy (all cores; idle and iowait excluded)."""
    parts = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(parts[:8]) - parts[3] - parts[4]) / TICK


def pid_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def children(pid: int) -> list[int]:
    """Direct children of every thread of a process."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            out += [int(c) for c in task.read_text().split()]
        except OSError:
            pass
    return out


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def worker_pid(daemon_pid: int, timeout: float = 10.0) -> int:
    """The training worker: the daemon's child started by multiprocessing's spawn (its other
    child, multiprocessing's resource tracker, is not it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [c for c in children(daemon_pid) if "spawn_main" in cmdline(c)]
        if len(found) == 1:
            return found[0]
        time.sleep(0.1)
    raise AssertionError(f"no single worker child of {daemon_pid}: {[cmdline(c) for c in children(daemon_pid)]}")


def pinner(cpus: set[int] | None, nice: int = 0) -> Callable[[], None] | None:
    """``preexec_fn`` for Popen: CPU affinity (and niceness) set in the child before it execs,
    while it has one thread, so that every thread and process it makes inherits them (a
    spawned training worker included). None when there is nothing to set."""
    if not cpus and not nice:
        return None

    def run() -> None:
        if cpus:
            os.sched_setaffinity(0, cpus)
        if nice:
            os.nice(nice)

    return run


def tasks_affinity(pid: int) -> set[int]:
    """Union of the CPU affinities of all threads of a process (empty once it is gone)."""
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out |= os.sched_getaffinity(int(task.name))
        except OSError:
            pass
    return out


def check_pinned(name: str, pid: int, cpus: set[int] | None) -> None:
    """Raise if some thread of ``pid`` may run outside ``cpus`` (a measurement would lie)."""
    if cpus is not None and (got := tasks_affinity(pid)) and got != cpus:
        raise RuntimeError(f"{name} (pid {pid}) may run on CPUs {sorted(got)}, expected {sorted(cpus)}")


def stop(proc: subprocess.Popen[bytes] | subprocess.Popen[str], timeout: float = 12.0,
         sig: int = signal.SIGTERM) -> int:
    """Signal a process (SIGTERM: a daemon's graceful stop), wait up to ``timeout``, then
    SIGKILL it; its exit code. A SIGSTOPped process is continued first, or it never exits."""
    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGCONT)
            proc.send_signal(sig)
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
        except ProcessLookupError:
            pass
    return proc.wait()


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


class DutyCycle:
    """Make processes run at a fraction of their speed, as a slower machine would: a thread
    stops them (and their descendants, e.g. a node's training worker) with SIGSTOP for
    ``1 - fraction`` of every ``period`` seconds and continues them for the rest. A context
    manager; on exit everything is continued."""

    def __init__(self, pids: list[int], fraction: float = 0.5, period: float = 0.1) -> None:
        if not 0 < fraction <= 1:
            raise ValueError("fraction must be in (0, 1]")
        self.pids, self.fraction, self.period = pids, fraction, period
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="duty-cycle", daemon=True)

    def _tree(self) -> list[int]:
        out, todo = [], list(self.pids)
        while todo:
            pid = todo.pop()
            out.append(pid)
            todo += children(pid)
        return out

    def _signal(self, sig: int) -> None:
        for pid in self._tree():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.fraction < 1:
                self._signal(signal.SIGSTOP)
                self._stop.wait(self.period * (1 - self.fraction))
                self._signal(signal.SIGCONT)
            self._stop.wait(self.period * self.fraction)

    def __enter__(self) -> DutyCycle:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self._signal(signal.SIGCONT)


def status_kb(pid: int, key: str) -> int:
    """A ``/proc/PID/status`` figure in kB (``VmRSS``, ``VmHWM``...); KeyError if absent."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def rss(pid: int) -> int:
    """Resident set size of a process, bytes (0 once it is gone)."""
    try:
        return status_kb(pid, "VmRSS") * 1024
    except (OSError, KeyError):
        return 0
