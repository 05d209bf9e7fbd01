"""What a benchmark reads of running nodes besides their status: peak memory of a node's two
processes, figures of ``/metrics``, lines of its log, and the machine's free memory.
"""

from __future__ import annotations

import re
import threading
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from benchlib.procs import children, cmdline


def vm_kib(pid: int, field: str) -> int:
    """``VmHWM`` (peak resident set), ``VmRSS`` ... of ``/proc/PID/status`` in KiB; 0 once gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def node_pids(daemon_pid: int) -> dict[str, int]:
    """The daemon and its training worker (the spawned child), where they run."""
    out = {"daemon": daemon_pid}
    for c in children(daemon_pid):
        if "spawn_main" in cmdline(c):
            out["worker"] = c
    return out


def peak_rss(daemon_pid: int) -> dict[str, int]:
    """Peak resident bytes so far of the daemon and of its worker (``VmHWM``: each process's
    own peak; their sum bounds the node's peak from above)."""
    return {k: 1024 * vm_kib(pid, "VmHWM") for k, pid in node_pids(daemon_pid).items()}


def rss_parts(pid: int) -> tuple[int, int]:
    """(anonymous, file and shared) resident bytes of ``pid`` now; (0, 0) once gone."""
    kib = {f: vm_kib(pid, f) for f in ("RssAnon", "RssFile", "RssShmem")}
    return 1024 * kib["RssAnon"], 1024 * (kib["RssFile"] + kib["RssShmem"])


class RssSampler:
    """The highest resident set of each node's daemon and worker *together*, sampled every
    ``every`` seconds in a thread, with its anonymous and file parts at that moment.

    Why beside ``peak_rss``: the sum of each process's own peak (``VmHWM``) adds peaks that
    need not come at once (a worker's publish, its daemon's fetch), so it bounds the node's
    peak from above; a sample of both at once can miss a short peak, so it bounds it from
    below. A benchmark reports both."""

    def __init__(self, daemon_pids: list[int], every: float = 0.2) -> None:
        self.daemon_pids = daemon_pids
        self.every = every
        #: per node: (total, anonymous, file) bytes at its highest sample
        self.peaks: list[tuple[int, int, int]] = [(0, 0, 0)] * len(daemon_pids)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            for i, pid in enumerate(self.daemon_pids):
                parts = [rss_parts(p) for p in node_pids(pid).values()]
                anon, file = sum(a for a, _ in parts), sum(f for _, f in parts)
                if anon + file > self.peaks[i][0]:
                    self.peaks[i] = (anon + file, anon, file)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5 + self.every)


def metrics(addr: str, timeout: float = 5.0) -> dict[str, float]:
    """Every sample of ``/metrics`` as ``name{labels}`` (labels sorted) -> value."""
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=timeout) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def metric_sum(values: dict[str, float], name: str) -> float:
    """Sum of a metric over all its label values."""
    return sum(v for k, v in values.items() if k == name or k.startswith(name + "{"))


def log_seconds(text: str, pattern: str) -> list[float]:
    """The seconds of every log line matching ``pattern`` (a regex with one group: the figure)."""
    return [float(m.group(1)) for m in re.finditer(pattern, text)]


def mem_available() -> int:
    """Bytes the kernel says could be handed out now without swapping (``MemAvailable``)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return 1024 * int(line.split()[1])
    return 0
