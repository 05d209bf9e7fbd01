#!/usr/bin/env python3
"""Daemon overhead: one node's training speed while its daemon serves three greedy peers,
against the same training loop run bare; and the bytes one exchange costs.

Setups, all alive for the whole run and measured in short slices, interleaved round by round
in a shuffled order (so that the load of whatever else runs on the machine hits every setup
alike); whichever setup is not being measured is idle or stopped (SIGSTOP), so costs no CPU:

* **bare**: ``ShardTrainer`` (same Config: small CNN, Fashion-MNIST if installed else
  synthetic, batch 64, 1 torch thread) stepped in a plain process: no daemon, no publishing;
* **bare + publish**: the same process, also calling ``DeltaPublisher.publish`` every ``publish_every`` steps
  (and encoding the pipe message) as the worker does: the worker's own share of the cost;
* per publish density (``--densities``), a real ``p2pnode start`` daemon (subprocess, real
  spawned worker, no peers of its own: it only trains, publishes and serves;
  ``training.eval_every=0``, ``checkpoint.interval=0``), in three modes:

  - **idle**: nobody pulls (publishing plus the daemon's mirror of x̂);
  - **flood**: three pullers, one keep-alive connection each, ask
    ``GET /v1/model?since=V&epoch=E`` back to back with no pause, each keeping its own
    since/epoch like a real peer (a snapshot first, then deltas): "as fast as they can";
  - **flood-nice**: the same, from pullers running at nice 19, so that they only get CPU that
    nobody else wants: closer to peers on other machines, whose CPU is not this node's;
  - **paced**: the same pullers, each asking once per bare training step (a real peer with
    ``exchange.every = 1`` that trains as fast as this node): the realistic payload mix.

  The pullers are a separate process (asyncio, ``--loops`` peers, aiohttp like
  ``PeerClient``); ``--puller-procs 3`` gives each peer its own process.

Samples/s: bare times its own steps; a daemon's worker is read from ``/v1/status``
(``training.samples``), each window starting and ending on a change of that counter (polled),
so that it spans whole steps. CPU time of every process we started comes from
``/proc/PID/stat`` over the same window, the machine's from ``/proc/stat``; "others" is the
machine's busy time minus ours (other people's jobs). With few cores the pullers compete with
the worker for CPU, which real peers on other machines would not: hence the "per CPU-second"
ratio, samples per second of CPU the worker actually got against bare's (1.00: the step itself
is no slower; all of the loss is CPU that went to other processes).

CPU placement (``--pin``, the default): "the peers are other machines". The node's processes
(the bare process; the daemon and its spawned worker, which inherits the daemon's affinity, as
do all their threads) are pinned to one CPU, the pullers and this script (which polls
``/v1/status`` and reads ``/proc``) to the others, with ``os.sched_setaffinity`` before the
exec. Bare and served then both get exactly one core for the node, and what the pullers burn
comes from "another machine" (other people's jobs may still run anywhere: *others* column).
``--no-pin`` leaves every process free to run on any CPU, so that on a small machine the
pullers take CPU from the node that a remote peer would not; with fewer than 2 CPUs in
``os.sched_getaffinity(0)`` the run falls back to that, and says so.

Every process started gets the same glibc malloc settings (``--malloc stable``, the default:
``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` so that freed activations stay in the
heap). With glibc's defaults a training process may take thousands of minor page faults per
step, or none, depending on its heap's history: 5 to 8 ms of system time on a 19 ms step, which
swings "bare against daemon" by +-30 % whichever way (``--malloc default`` shows it; the
*page faults/step* column tells).

Bytes: dense fp32 size of the model (sum numel x 4) against what the pullers received:
snapshot, the newest delta (``since = version - 1``: the worker's own "add" payload), merged
deltas (``since`` further back: one "set" payload) and the mean bytes per request (304 = 0).

    .venv/bin/python scripts/bench_overhead.py                  # ~5 min: 7 rounds, 1 % and 10 %
    .venv/bin/python scripts/bench_overhead.py --rounds 2 --densities 0.01 --no-write
    .venv/bin/python scripts/bench_overhead.py --profile        # + py-spy of daemon and pullers
    .venv/bin/python scripts/bench_overhead.py --no-pin         # everything shares every CPU

Prints the tables and replaces the ``## Daemon overhead`` section of docs/BENCHMARKS.md
(``--no-write`` leaves the file alone).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import math
import os
import platform
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DOC = ROOT / "docs" / "BENCHMARKS.md"
SECTION = "## Daemon overhead"
TICK = os.sysconf("SC_CLK_TCK")
MODES = ("idle", "flood", "flood-nice", "paced")
#: glibc settings for every process started (``--malloc stable``): big freed blocks stay in the
#: heap instead of going back to the kernel, so no process pays thousands of page faults a step
STABLE_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(64 << 20), "MALLOC_TRIM_THRESHOLD_": str(256 << 20)}
ENV: dict[str, str] | None = None  # environment of the processes we start (None: ours)
#: CPUs of the node's processes (bare; daemon + worker) and of the pullers (``--pin``); None: any
NODE_CPUS: set[int] | None = None
PEER_CPUS: set[int] | None = None
BATCH = 64
LABELS = {"bare": "bare ShardTrainer", "bare+publish": "bare + publish, no daemon",
          "idle": "daemon, nobody pulls", "flood": "daemon + 3 pullers flat out",
          "flood-nice": "daemon + 3 pullers flat out at nice 19",
          "paced": "daemon + 3 pullers, 1 pull/step each"}

# ------------------------------------------------------------------------------ /proc helpers


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system, all threads) a live process has used; 0 if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = raw[raw.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (fields 14, 15)


def minor_faults(pid: int) -> int:
    """Minor page faults of a process so far (glibc handing big blocks back to the kernel and
    taking them again shows up here, and as system CPU time)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(raw[raw.rindex(")") + 2:].split()[7])  # minflt (field 10)


def machine_busy() -> float:
    """CPU seconds the whole machine has been busy (all cores; idle, iowait excluded)."""
    parts = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(parts[:8]) - parts[3] - parts[4]) / TICK


def children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(x) for x in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def pinner(cpus: set[int] | None, nice: int = 0):
    """``preexec_fn`` for Popen: set the CPU affinity (and niceness) in the child before it
    execs, while it has one thread, so that every thread and child process it makes inherits
    it (a ``multiprocessing`` spawned worker included)."""
    if not cpus and not nice:
        return None

    def run() -> None:
        if cpus:
            os.sched_setaffinity(0, cpus)
        if nice:
            os.nice(nice)

    return run


def tasks_affinity(pid: int) -> set[int]:
    """Union of the CPU affinities of all threads of a process (empty if it is gone)."""
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out |= os.sched_getaffinity(int(task.name))
        except OSError:
            pass
    return out


def check_pinned(name: str, pid: int, cpus: set[int] | None) -> None:
    if cpus is not None and (got := tasks_affinity(pid)) and got != cpus:
        raise RuntimeError(f"{name} (pid {pid}) may run on CPUs {sorted(got)}, expected {sorted(cpus)}")


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def pick_data(requested: str) -> str:
    if requested != "auto":
        return requested
    from p2pnode.data import DataError, _find_fashion_source

    try:
        _find_fashion_source(None)
        return "fashion-mnist"
    except DataError:
        return "synthetic"


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    return "[" + ", ".join(toml_value(x) for x in v) + "]"


def write_config(path: Path, sets: list[str], data: str, density: float) -> dict[str, Any]:
    """Freeze the node config (defaults of this tree + ``sets``) into a TOML file that the bare
    process and the daemon both load: later edits of the defaults cannot make them differ."""
    from p2pnode.config import Config, set_option, validate

    cfg = Config()
    for item in [f"training.data={data}", *sets, f"compression.publish=topk:density={density:g}"]:
        key, _, value = item.partition("=")
        set_option(cfg, key.strip(), value.strip())
    validate(cfg)
    d = cfg.to_dict()
    path.write_text("\n".join(f"[{sec}]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in vals.items())
                              for sec, vals in d.items()))
    return d


def read_reply(p: subprocess.Popen) -> dict[str, Any]:
    assert p.stdout is not None
    line = p.stdout.readline()
    if not line:
        raise RuntimeError(f"helper process {p.pid} died (exit code {p.poll()})")
    return json.loads(line)


def tell(p: subprocess.Popen, cmd: str) -> None:
    assert p.stdin is not None
    p.stdin.write(cmd + "\n")
    p.stdin.flush()


# ------------------------------------------------------------------------------ role: bare


def role_bare(args: argparse.Namespace) -> None:
    """The training loop alone, on command: ``train SECONDS`` or ``publish SECONDS`` (the
    latter also publishes every ``compression.publish_every`` steps, as the worker does, minus
    the pipe)."""
    from p2pnode.compression.registry import build_sparsifier
    from p2pnode.config import Config
    from p2pnode.models import fingerprint
    from p2pnode.wire.codec import ModelSpec
    from p2pnode import pipe_protocol as m
    from p2pnode.worker.public import DeltaPublisher, floating_state
    from p2pnode.worker.training import ShardTrainer

    from p2pnode.config import load_file

    cfg = Config.from_dict(load_file(args.config))  # the very file the daemon runs with
    trainer = ShardTrainer(cfg)
    spec = ModelSpec.from_state_dict(floating_state(trainer.model), fingerprint(trainer.model))
    public = DeltaPublisher(trainer.model, spec, build_sparsifier(cfg.compression.publish), "bare", "e", 0)

    def step(publish: bool) -> None:
        loss = trainer.train_step()
        if publish and trainer.step % cfg.compression.publish_every == 0:
            m.encode(m.Published(version=public.version + 1, delta=public.publish(trainer.step, trainer.loss_ema)))
        m.encode(m.Progress(step=trainer.step, samples=trainer.samples, loss=loss, done=False, lr=0.0))

    for i in range(args.warmup_steps):
        step(i % 2 == 0)
    print(json.dumps({"ok": "ready"}), flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        publish, seconds = words[0] == "publish", float(words[1])
        me = os.getpid()
        t0, c0, b0, s0, n0 = time.monotonic(), time.process_time(), machine_busy(), trainer.samples, trainer.step
        f0 = minor_faults(me)
        while time.monotonic() - t0 < seconds:
            step(publish)
        t1, c1, b1, f1 = time.monotonic(), time.process_time(), machine_busy(), minor_faults(me)
        print(json.dumps({"seconds": t1 - t0, "samples": trainer.samples - s0, "steps": trainer.step - n0,
                          "cpu": c1 - c0, "busy": b1 - b0, "faults": f1 - f0}), flush=True)


# ------------------------------------------------------------------------------ role: puller


class PullStats:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.count: Counter[str] = Counter()
        self.nbytes: Counter[str] = Counter()
        self.latency: list[float] = []
        self.spans: list[int] = []  # versions each merged delta spans

    def report(self) -> dict[str, Any]:
        lat = sorted(self.latency)
        return {"count": dict(self.count), "bytes": dict(self.nbytes), "spans": self.spans,
                "lat_ms_p50": 1e3 * lat[len(lat) // 2] if lat else None}


async def puller_main(args: argparse.Namespace) -> None:
    """``--loops`` emulated peers; stdin commands: idle | flood | paced SECONDS | mark |
    report | quit; each answered by one JSON line on stdout."""
    import aiohttp
    import msgpack

    stats = PullStats()
    state: dict[str, Any] = {"mode": "idle", "interval": 0.05, "dense": None, "snapshot": None}
    changed = asyncio.Event()
    loop = asyncio.get_running_loop()
    base = f"http://{args.addr}/v1/model"

    async def peer(i: int) -> None:
        since: int | None = None
        epoch = ""
        timeout = aiohttp.ClientTimeout(total=300)  # its daemon may be SIGSTOPped a while
        connector = aiohttp.TCPConnector(limit=1)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False) as s:
            due = time.monotonic()
            while True:
                mode = state["mode"]
                if mode == "quit":
                    return
                if mode == "idle":
                    changed.clear()
                    await changed.wait()
                    due = time.monotonic() + state["interval"] * i / args.loops  # spread the peers
                    continue
                if mode == "paced":
                    now = time.monotonic()
                    if due > now:
                        await asyncio.sleep(due - now)
                    due = max(due + state["interval"], time.monotonic() - state["interval"])
                    if state["mode"] != "paced":
                        continue
                url = base if since is None else f"{base}?since={since}&epoch={epoch}"
                t0 = time.perf_counter()
                try:
                    async with s.get(url) as resp:
                        body = await resp.read()
                        status, headers = resp.status, resp.headers
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    stats.count["error"] += 1
                    since = None
                    await asyncio.sleep(0.05)
                    continue
                stats.latency.append(time.perf_counter() - t0)
                if status == 304:
                    kind = "not_modified"
                elif status == 200:
                    version = int(headers["X-P2P-Version"])
                    if headers.get("X-P2P-Kind") == "snapshot":
                        kind = "snapshot"
                        obj = msgpack.unpackb(body, raw=False)
                        epoch = obj["epoch"]
                        state["snapshot"] = len(body)
                        state["dense"] = 4 * sum(math.prod(shape) for _, shape, _ in obj["specs"])
                    elif since is not None and version == since + 1:
                        kind = "delta"
                    else:
                        kind = "merged"
                        stats.spans.append(version - (since or 0))
                    since = version
                else:
                    kind = f"http_{status}"
                    since = None
                stats.count[kind] += 1
                stats.nbytes[kind] += len(body)

    def command(line: str) -> None:
        words = line.split()
        if not words:
            return
        cmd = words[0]
        reply: dict[str, Any] = {"ok": cmd}
        if cmd in ("idle", "flood", "paced", "quit"):
            if cmd == "paced":
                state["interval"] = float(words[1])
            state["mode"] = cmd
            changed.set()
        elif cmd == "mark":
            stats.reset()
        elif cmd == "report":
            reply = stats.report()
            reply["dense"], reply["snapshot"] = state["dense"], state["snapshot"]
        print(json.dumps(reply), flush=True)

    def read_stdin() -> None:
        for line in sys.stdin:
            loop.call_soon_threadsafe(command, line)
        loop.call_soon_threadsafe(command, "quit")

    threading.Thread(target=read_stdin, daemon=True).start()
    print(json.dumps({"ok": "ready"}), flush=True)
    await asyncio.gather(*(peer(i) for i in range(args.loops)))


# ------------------------------------------------------------------------------ orchestration


def get_json(addr: str, path: str, timeout: float = 10.0) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{addr}{path}", timeout=timeout) as resp:
        return json.load(resp)


class Bare:
    def __init__(self, args: argparse.Namespace, config: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__, "--role", "bare", "--config", str(config),
                                      "--warmup-steps", str(args.warmup_steps)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1, env=ENV,
                                     preexec_fn=pinner(NODE_CPUS))  # noqa: PLW1509 (no threads here)
        read_reply(self.proc)
        check_pinned("bare process", self.proc.pid, NODE_CPUS)

    def run(self, publish: bool, seconds: float) -> dict[str, Any]:
        tell(self.proc, f"{'publish' if publish else 'train'} {seconds}")
        r = read_reply(self.proc)
        sec = r["seconds"]
        return {"sps": r["samples"] / sec, "steps": r["steps"], "seconds": sec, "worker_cpu": r["cpu"] / sec,
                "faults_per_step": r["faults"] / max(r["steps"], 1),
                "daemon_cpu": 0.0, "puller_cpu": 0.0, "others_cpu": max(0.0, r["busy"] - r["cpu"]) / sec,
                "pulls": None}

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Pullers:
    """One or more puller processes, driven line by line."""

    def __init__(self, addr: str, loops: int, procs: int, nice: int = 0) -> None:
        per = [loops // procs + (1 if i < loops % procs else 0) for i in range(procs)]
        self.procs = [subprocess.Popen(
            [sys.executable, __file__, "--role", "puller", "--addr", addr, "--loops", str(n)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1, env=ENV,
            preexec_fn=pinner(PEER_CPUS, nice)) for n in per if n]  # noqa: PLW1509
        for p in self.procs:
            read_reply(p)
            check_pinned("puller", p.pid, PEER_CPUS)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def send(self, cmd: str) -> list[dict[str, Any]]:
        for p in self.procs:
            tell(p, cmd)
        return [read_reply(p) for p in self.procs]

    def report(self) -> dict[str, Any]:
        out: dict[str, Any] = {"count": Counter(), "bytes": Counter(), "spans": [], "lat": [], "dense": None,
                               "snapshot": None}
        for r in self.send("report"):
            out["count"].update(r["count"])
            out["bytes"].update(r["bytes"])
            out["spans"] += r["spans"]
            out["dense"] = out["dense"] or r["dense"]
            out["snapshot"] = out["snapshot"] or r["snapshot"]
            if r["lat_ms_p50"] is not None:
                out["lat"].append(r["lat_ms_p50"])
        out["lat_ms_p50"] = statistics.median(out.pop("lat")) if out["lat"] else None
        return out

    def close(self) -> None:
        for p in self.procs:
            try:
                assert p.stdin is not None
                p.stdin.close()
            except OSError:
                pass
        for p in self.procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


class Daemon:
    """A real ``p2pnode start`` in a temporary state dir, on a free loopback port."""

    def __init__(self, config: Path, density: float, log_dir: Path) -> None:
        self.density = density
        self.state = Path(tempfile.mkdtemp(prefix="bench-overhead-"))
        self.log_path = log_dir / f"daemon-{density:g}.log"
        self.log = open(self.log_path, "w")
        cmd = [sys.executable, "-m", "p2pnode", "start", "--config", str(config), "--listen", "127.0.0.1:0",
               "--state-dir", str(self.state)]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT, env=ENV,
                                     preexec_fn=pinner(NODE_CPUS))  # noqa: PLW1509 (the worker inherits it)
        self.addr = ""
        self.worker = 0
        self.pullers: Pullers | None = None
        self.pullers_nice: Pullers | None = None  # the same, at nice 19
        self.stopped = False

    def wait_ready(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {self.proc.returncode}; see {self.log_path}")
            log = self.log_path.read_text()
            if "training worker exited" in log:
                tail = "\n".join(log.splitlines()[-12:])
                raise RuntimeError(f"the daemon's worker died; end of {self.log_path}:\n{tail}")
            if not self.addr:
                found = re.search(r"listening on (\S+) \(state", log)
                if found:
                    self.addr = found.group(1)
            if self.addr:
                try:
                    t = get_json(self.addr, "/v1/status", 2.0)["training"]
                    if t["worker_alive"] and t["step"] >= 5:
                        kids = [c for c in children(self.proc.pid)
                                if "spawn_main" in cmdline(c) and "resource_tracker" not in cmdline(c)]
                        if kids:
                            self.worker = kids[0]
                            check_pinned("daemon", self.proc.pid, NODE_CPUS)
                            check_pinned("worker", self.worker, NODE_CPUS)
                            return
                except OSError:
                    pass
            time.sleep(0.2)
        raise RuntimeError(f"daemon not ready in {timeout:.0f} s; see {self.log_path}")

    def pause(self) -> None:
        """SIGSTOP worker, then daemon (a stopped daemon would block the worker's pipe)."""
        if not self.stopped:
            os.kill(self.worker, signal.SIGSTOP)
            os.kill(self.proc.pid, signal.SIGSTOP)
            self.stopped = True

    def resume(self) -> None:
        if self.stopped:
            os.kill(self.proc.pid, signal.SIGCONT)
            os.kill(self.worker, signal.SIGCONT)
            self.stopped = False

    def samples(self) -> int:
        return int(get_json(self.addr, "/v1/status")["training"]["samples"])

    def edge(self, limit: float = 1.0) -> tuple[float, int]:
        """(time, samples) right after the worker's samples counter moves (whole steps)."""
        first = self.samples()
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            s = self.samples()
            now = time.monotonic()
            if s != first:
                return now, s
            time.sleep(0.005)
        return time.monotonic(), self.samples()

    def stop(self) -> None:
        for pullers in (self.pullers, self.pullers_nice):
            if pullers is not None:
                pullers.close()
        self.resume()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.state, ignore_errors=True)


def measure_daemon(args: argparse.Namespace, d: Daemon, mode: str, pace: float) -> dict[str, Any]:
    pullers = d.pullers_nice if mode == "flood-nice" else d.pullers
    assert pullers is not None
    pullers.send({"paced": f"paced {pace:.6f}", "flood-nice": "flood"}.get(mode, mode))
    time.sleep(args.settle)
    pullers.send("mark")
    me = os.getpid()
    pids = pullers.pids

    def cpu() -> tuple[float, ...]:
        return (proc_cpu(d.worker), proc_cpu(d.proc.pid), sum(map(proc_cpu, pids)), proc_cpu(me),
                machine_busy())

    t0, s0 = d.edge()
    c0, f0 = cpu(), minor_faults(d.worker)
    time.sleep(max(0.0, args.window - 0.05))
    t1, s1 = d.edge()
    c1, f1 = cpu(), minor_faults(d.worker)
    pulls = pullers.report() if mode != "idle" else None
    pullers.send("idle")
    sec = t1 - t0
    w, dm, p, o, b = (x1 - x0 for x0, x1 in zip(c0, c1))
    return {"sps": (s1 - s0) / sec, "steps": (s1 - s0) / BATCH, "seconds": sec, "worker_cpu": w / sec,
            "faults_per_step": (f1 - f0) / max((s1 - s0) / BATCH, 1),
            "daemon_cpu": dm / sec, "puller_cpu": p / sec, "others_cpu": max(0.0, b - w - dm - p - o) / sec,
            "pulls": pulls}


def profile_flood(args: argparse.Namespace, d: Daemon, log_dir: Path) -> dict[str, Any]:
    """py-spy (CPU samples only) of the daemon and the pullers during a flood window."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        return {"error": {"error": "py-spy not installed (.venv/bin/pip install py-spy)"}}
    assert d.pullers is not None
    d.resume()
    d.pullers.send("flood")
    time.sleep(args.settle)
    targets = {"daemon": d.proc.pid, "pullers": d.pullers.pids[0]}
    files = {name: log_dir / f"pyspy-{name}.txt" for name in targets}
    spies = {name: subprocess.Popen([spy, "record", "-p", str(pid), "-d", str(int(args.profile_seconds)),
                                     "-r", "100", "-f", "raw", "-o", str(files[name]), "--nonblocking"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                    preexec_fn=pinner(PEER_CPUS))  # noqa: PLW1509 (not the node)
             for name, pid in targets.items()}
    out: dict[str, Any] = {}
    for name, s in spies.items():
        _, err = s.communicate(timeout=args.profile_seconds + 60)
        if s.returncode != 0 or not files[name].exists():
            out[name] = {"error": ((err or "").strip().splitlines() or ["py-spy failed"])[0]}
        else:
            out[name] = summarize_stacks(files[name])
    d.pullers.send("idle")
    return out


#: buckets for py-spy stacks: the first whose needle is anywhere in the stack wins
BUCKETS = [
    ("publisher.serve / serve_now", ("serve (p2pnode/wire/publisher.py", "serve_now (p2pnode/wire/publisher.py")),
    ("publisher.publish (decode + apply the worker's deltas)", ("publish (p2pnode/wire/publisher.py",)),
    ("pipe reader thread (recv + msgpack)", ("_read_pipe (p2pnode/daemon/trainer.py",)),
    ("thread pool of to_thread (wake-ups, futures)", ("_worker (concurrent/futures/thread.py",)),
    ("GET /v1/model handler", ("get_model (p2pnode/daemon/http.py",)),
    ("/v1/status handler", ("get_status (p2pnode/daemon/http.py",)),
    ("trainer dispatch (Progress, Published)", ("_dispatch (p2pnode/daemon/trainer.py",)),
    ("aiohttp (HTTP machinery)", ("(aiohttp/",)),
    ("puller's own code", ("peer (bench_overhead.py", "peer (scripts/bench_overhead.py")),
    ("event loop itself (poll, socket I/O, C-level callbacks)", ("(asyncio/", "(uvloop", "(selectors.py")),
]


def summarize_stacks(path: Path) -> dict[str, Any]:
    """py-spy raw (collapsed) stacks -> share of samples per bucket, and the top leaf frames."""
    total = 0
    buckets: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        count = int(n)
        total += count
        leaf = stack.split(";")[-1]
        leaves[re.sub(r"\(/.*?/site-packages/", "(", re.sub(r":\d+\)", ")", leaf))] += count
        for label, needles in BUCKETS:
            if any(needle in stack for needle in needles):
                buckets[label] += count
                break
        else:
            buckets["other"] += count
    return {"samples": total, "buckets": {k: v / max(total, 1) for k, v in buckets.most_common()},
            "leaves": {k: v / max(total, 1) for k, v in leaves.most_common(6)}}


# ------------------------------------------------------------------------------ report


def med(values: list[float]) -> float:
    values = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.median(values) if values else float("nan")


def quartiles(values: list[float]) -> tuple[float, float, float]:
    v = sorted(values)
    if len(v) < 4:
        return med(v), v[0], v[-1]
    q = statistics.quantiles(v, n=4)
    return q[1], q[0], q[2]


def fmt_int(x: float | None) -> str:
    return "-" if x is None or math.isnan(x) else f"{x:,.0f}".replace(",", " ")


def build_tables(results: list[dict[str, Any]], densities: list[float],
                 modes: list[str]) -> tuple[str, str, dict[tuple[float, str], tuple[float, float]]]:
    """Markdown: speed and CPU per setup; bytes per exchange; and (ratio, per-CPU ratio)."""
    bare = {r["round"]: r for r in results if r["setup"] == "bare"}
    bare_eff = {k: v["sps"] / max(v["worker_cpu"], 1e-9) for k, v in bare.items()}
    rows = ["| setup | samples/s | / bare (IQR) | per CPU-second / bare | worker CPU | ms CPU/step | page faults/step "
            "| daemon CPU | pullers CPU | others CPU | requests/s | daemon µs CPU/request "
            "| 304 / delta / merged / snapshot |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    idle_daemon = {d: med([r["daemon_cpu"] for r in results if r["setup"] == "idle" and r.get("density") == d])
                   for d in densities}
    headline: dict[tuple[float, str], tuple[float, float]] = {}
    setups = [("bare", None), ("bare+publish", None)] + [(m, d) for d in densities for m in modes]
    for setup, density in setups:
        rs = [r for r in results if r["setup"] == setup and r.get("density") == density]
        if not rs:
            continue
        ratio, lo, hi = quartiles([r["sps"] / bare[r["round"]]["sps"] for r in rs])
        eff = med([(r["sps"] / max(r["worker_cpu"], 1e-9)) / bare_eff[r["round"]] for r in rs])
        if density is not None:
            headline[(density, setup)] = (ratio, eff)
        mix = reqs = per_req = "-"
        pulls = [r["pulls"] for r in rs if r["pulls"]]
        if pulls:
            c: Counter[str] = Counter()
            for p in pulls:
                c.update(p["count"])
            n = sum(c.values())
            mix = " / ".join(f"{100 * c.get(k, 0) / max(n, 1):.0f} %"
                             for k in ("not_modified", "delta", "merged", "snapshot"))
            if other := {k: v for k, v in c.items() if k not in ("not_modified", "delta", "merged", "snapshot")}:
                mix += f" (+ {other})"
            reqs = fmt_int(med([sum(r["pulls"]["count"].values()) / r["seconds"] for r in rs if r["pulls"]]))
            base = idle_daemon.get(density, float("nan"))
            base = 0.0 if math.isnan(base) else base
            per_req = fmt_int(med([1e6 * (r["daemon_cpu"] - base) / max(sum(r["pulls"]["count"].values())
                                                                       / r["seconds"], 1e-9)
                                   for r in rs if r["pulls"]]))
        label = LABELS[setup] + (f", {density * 100:g} %" if density is not None else "")
        dash = density is None
        rows.append(
            f"| {label} | {fmt_int(med([r['sps'] for r in rs]))} | {ratio:.2f} ({lo:.2f}-{hi:.2f}) | {eff:.2f} "
            f"| {med([r['worker_cpu'] for r in rs]):.2f} "
            f"| {med([1e3 * r['worker_cpu'] * r['seconds'] / max(r['steps'], 1) for r in rs]):.1f} "
            f"| {fmt_int(med([r.get('faults_per_step', float('nan')) for r in rs]))} "
            f"| {'-' if dash else format(med([r['daemon_cpu'] for r in rs]), '.2f')} "
            f"| {'-' if dash else format(med([r['puller_cpu'] for r in rs]), '.2f')} "
            f"| {med([r['others_cpu'] for r in rs]):.2f} | {reqs} | {per_req} | {mix} |")

    brows = ["| publish density | dense fp32 | snapshot | newest delta (`since = v-1`) "
             "| merged delta (mean versions spanned) | mean per request, paced | mean per request, flat out |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for density in densities:
        count: Counter[str] = Counter()
        nbytes: Counter[str] = Counter()
        per_req: dict[str, list[float]] = {"paced": [], "flood": []}
        spans: list[int] = []
        dense = snapshot = None
        for r in results:
            if r.get("density") != density or not r["pulls"]:
                continue
            p = r["pulls"]
            dense, snapshot = dense or p["dense"], snapshot or p["snapshot"]
            count.update(p["count"])
            nbytes.update(p["bytes"])
            spans += p["spans"]
            n = sum(p["count"].values())
            if n and r["setup"] in per_req:
                per_req[r["setup"]].append(sum(p["bytes"].values()) / n)
        if not dense:
            continue

        def pct(x: float) -> str:
            return f"{fmt_int(x)} ({100 * x / dense:.2f} %)"

        def cell(kind: str) -> str:
            return pct(nbytes[kind] / count[kind]) if count.get(kind) else "-"

        span = f" ({statistics.fmean(spans):.1f})" if spans else ""
        brows.append(f"| {density * 100:g} % | {fmt_int(dense)} | {pct(snapshot) if snapshot else '-'} "
                     f"| {cell('delta')} | {cell('merged')}{span} | "
                     + " | ".join(pct(med(per_req[m])) if per_req[m] else "-" for m in ("paced", "flood")) + " |")
    return "\n".join(rows), "\n".join(brows), headline


def reading(results: list[dict[str, Any]], density: float, pinned: bool = False) -> str:
    """A few sentences drawn from the figures at one density (medians; "/ bare" per round)."""
    bare = {r["round"]: r for r in results if r["setup"] == "bare"}

    def get(setup: str) -> dict[str, float] | None:
        rs = [r for r in results if r["setup"] == setup and r.get("density") in (None, density)]
        if not rs:
            return None
        eff = [(r["sps"] / max(r["worker_cpu"], 1e-9)) / (bare[r["round"]]["sps"] / bare[r["round"]]["worker_cpu"])
               for r in rs]
        return {"ratio": med([r["sps"] / bare[r["round"]]["sps"] for r in rs]), "eff": med(eff),
                "ms": med([1e3 * r["worker_cpu"] * r["seconds"] / max(r["steps"], 1) for r in rs]),
                "worker": med([r["worker_cpu"] for r in rs]), "daemon": med([r["daemon_cpu"] for r in rs]),
                "pullers": med([r["puller_cpu"] for r in rs])}

    b, bp, idle = get("bare"), get("bare+publish"), get("idle")
    out = []
    if b and bp:
        extra = bp["ms"] - b["ms"]
        out.append(f"Publishing alone (`DeltaPublisher.publish` every `compression.publish_every` steps: top-k of x - x̂ per tensor, "
                   f"then encoding; no daemon) adds {extra:.1f} ms of CPU to a {b['ms']:.1f} ms step "
                   f"({100 * extra / b['ms']:.0f} %) and runs at {bp['ratio']:.2f} of bare.")
    if idle:
        out.append(f"The daemon with nobody pulling runs at {idle['ratio']:.2f} ({idle['eff']:.2f} per "
                   f"CPU-second); its own mirror of x̂ and pipe take {idle['daemon']:.2f} cores.")
    flood = get("flood")
    if flood and idle:
        same = abs(flood["eff"] - idle["eff"]) <= 0.05
        out.append(f"Flat out, the daemon and the pullers take {flood['daemon']:.2f} + {flood['pullers']:.2f} "
                   f"cores and the worker gets {flood['worker']:.2f} cores instead of {idle['worker']:.2f}; "
                   f"per CPU-second it is at {flood['eff']:.2f} of bare against {idle['eff']:.2f} idle: "
                   + ("the step itself is no slower, it gets less CPU." if same
                      else f"the step itself is {abs(1 - flood['eff'] / idle['eff']) * 100:.0f} % "
                           f"{'slower' if flood['eff'] < idle['eff'] else 'faster'} than with nobody pulling."))
    nice = get("flood-nice")
    if nice:
        why = ("on their own core already, so nice should change little" if pinned
               else "peers whose CPU is not this node's")
        out.append(f"With the pullers at nice 19 ({why}) the ratio is {nice['ratio']:.2f}, "
                   f"the daemon taking {nice['daemon']:.2f} cores.")
    paced = get("paced")
    if paced:
        out.append(f"Paced like real peers, the ratio is {paced['ratio']:.2f} ({paced['eff']:.2f} per "
                   f"CPU-second), daemon and pullers taking {paced['daemon']:.2f} + {paced['pullers']:.2f} cores.")
    return textwrap.fill(" ".join(out), width=100, break_on_hyphens=False)


def profile_markdown(prof: dict[str, Any]) -> str:
    lines = []
    for name, p in prof.items():
        if "error" in p:
            lines.append(f"- {name}: {p['error']}")
            continue
        top = ", ".join(f"{k} {100 * v:.0f} %" for k, v in p["buckets"].items() if v >= 0.02)
        leaves = "; ".join(f"`{k}` {100 * v:.0f} %" for k, v in p["leaves"].items())
        lines.append(f"- **{name}** ({p['samples']} samples): {top}.\n  Top leaf frames: {leaves}")
    return "\n".join(lines)


def write_section(text: str) -> None:
    """Replace our section of docs/BENCHMARKS.md (up to the next ``## ``), or append it."""
    DOC.parent.mkdir(parents=True, exist_ok=True)
    old = DOC.read_text() if DOC.exists() else "# Benchmarks\n"
    lines = old.splitlines(keepends=True)
    start = next((i for i, ln in enumerate(lines) if ln.rstrip() == SECTION), None)
    if start is None:
        DOC.write_text(old.rstrip("\n") + "\n\n" + text.rstrip("\n") + "\n")
        return
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    tail = "".join(lines[end:])
    DOC.write_text("".join(lines[:start]) + text.rstrip("\n") + "\n" + ("\n" + tail if tail else ""))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--window", type=float, default=2.5, help="seconds measured per setup per round")
    ap.add_argument("--settle", type=float, default=0.5, help="seconds after resuming/switching, not measured")
    ap.add_argument("--warmup-steps", type=int, default=30, help="bare steps before measuring")
    ap.add_argument("--densities", default="0.01,0.1", help="publish top-k densities (comma separated)")
    ap.add_argument("--modes", default=",".join(MODES), help="daemon modes: " + ", ".join(MODES))
    ap.add_argument("--loops", type=int, default=3, help="emulated peers")
    ap.add_argument("--puller-procs", type=int, default=1, help="processes the peers are spread over")
    ap.add_argument("--pace", default="auto",
                    help="seconds between one peer's pulls in paced mode; auto: bare's step time")
    ap.add_argument("--data", default="auto", help="fashion-mnist, synthetic, or auto (the former if installed)")
    ap.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True,
                    help="node (bare; daemon + worker) on one CPU, pullers and this script on the others: "
                         "peers on other machines (default); --no-pin: every process on any CPU")
    ap.add_argument("--malloc", choices=("stable", "default"), default="stable",
                    help="stable: glibc keeps freed memory (same env for bare, daemon and worker); "
                         "default: glibc as is, whose page faults swing the step time from process to process")
    ap.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE",
                    help="config overrides for bare and daemon alike (default: training.eval_every=0 "
                         "and checkpoint.interval=0; giving any replaces both)")
    ap.add_argument("--profile", action="store_true", help="then py-spy the daemon under flood (1st density)")
    ap.add_argument("--profile-seconds", type=float, default=8.0)
    ap.add_argument("--seed", type=int, default=0, help="of the shuffled slice order")
    ap.add_argument("--no-write", action="store_true", help="do not touch docs/BENCHMARKS.md")
    ap.add_argument("--json", metavar="FILE", help="also dump every measurement")
    ap.add_argument("--role", choices=("main", "bare", "puller"), default="main", help=argparse.SUPPRESS)
    ap.add_argument("--addr", help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.role == "bare":
        role_bare(args)
        return 0
    if args.role == "puller":
        asyncio.run(puller_main(args))
        return 0

    global ENV, NODE_CPUS, PEER_CPUS
    if args.malloc == "stable":
        ENV = {**os.environ, **STABLE_MALLOC}
    allowed = sorted(os.sched_getaffinity(0))
    if args.pin and len(allowed) >= 2:
        NODE_CPUS, PEER_CPUS = {allowed[0]}, set(allowed[1:])
        os.sched_setaffinity(0, PEER_CPUS)  # this script polls and reads /proc: not the node's CPU
        placement = (f"pinned (`--pin`): the node's processes (bare process; daemon and its worker, "
                     f"all threads) on CPU {allowed[0]}, the pullers, py-spy and the script itself on CPU(s) "
                     f"{','.join(map(str, allowed[1:]))} (peers on other machines; bare and served both get "
                     f"exactly one core); other people's jobs may run on any CPU")
    elif args.pin:
        placement = (f"unpinned: `--pin` asked, but only {len(allowed)} CPU(s) in this process's affinity "
                     f"mask, so every process shares {'it' if len(allowed) == 1 else 'them'}; the pullers take "
                     f"CPU from the node that remote peers would not")
        print(f"# --pin needs at least 2 CPUs, affinity has {allowed}: running unpinned", flush=True)
    else:
        placement = ("unpinned (`--no-pin`): every process may run on any CPU, so the pullers take CPU "
                     "from the node that remote peers would not")
    pinned = NODE_CPUS is not None
    data = pick_data(args.data)
    densities = [float(x) for x in args.densities.split(",") if x]
    from p2pnode.config import Config

    default_spec = Config().compression.publish  # the headline density: the default's, if measured
    found = re.fullmatch(r"topk:density=([0-9.eE+-]+)", default_spec)
    default_density = float(found.group(1)) if found else None
    if default_density in densities:
        densities.remove(default_density)
        densities.insert(0, default_density)
    modes = [m for m in args.modes.split(",") if m]
    if bad := [m for m in modes if m not in MODES]:
        ap.error(f"unknown mode(s) {bad}")
    command = " ".join([".venv/bin/python", "scripts/bench_overhead.py", *sys.argv[1:]])
    started = time.monotonic()
    load0 = os.getloadavg()
    log_dir = Path(tempfile.mkdtemp(prefix="bench-overhead-logs-"))
    sets = args.set if args.set is not None else ["training.eval_every=0", "checkpoint.interval=0"]
    configs = {d: log_dir / f"node-{d:g}.toml" for d in densities}
    frozen = {d: write_config(path, sets, data, d) for d, path in configs.items()}
    ncfg = frozen[densities[0]]
    print(f"# data {data}; {args.rounds} rounds of {args.window:g} s slices; densities {densities}; "
          f"modes {modes}; logs in {log_dir}", flush=True)
    print(f"# CPU placement: {placement}", flush=True)

    results: list[dict[str, Any]] = []
    daemons: list[Daemon] = []
    bare: Bare | None = None
    prof = None
    try:
        for density in densities:  # start them all, one at a time, then stop each
            d = Daemon(configs[density], density, log_dir)
            daemons.append(d)
            d.wait_ready()
            d.pullers = Pullers(d.addr, args.loops, args.puller_procs)
            if "flood-nice" in modes:
                d.pullers_nice = Pullers(d.addr, args.loops, args.puller_procs, nice=19)
            d.pause()
        bare = Bare(args, configs[densities[0]])
        pace = float(args.pace) if args.pace != "auto" else BATCH / bare.run(False, 2.0)["sps"]
        print(f"# paced pullers: one pull per {1e3 * pace:.1f} ms each", flush=True)
        slices: list[tuple[str, Daemon | None]] = [("bare", None), ("bare+publish", None)]
        slices += [(m, d) for d in daemons for m in modes]
        rng = random.Random(args.seed)
        for rnd in range(args.rounds):
            order = slices[:]
            rng.shuffle(order)
            line = []
            for setup, d in order:
                for other in daemons:
                    if other is not d:
                        other.pause()
                if d is None:
                    time.sleep(args.settle)
                    r = bare.run(setup == "bare+publish", args.window)
                else:
                    d.resume()
                    r = measure_daemon(args, d, setup, pace)
                    r["density"] = d.density
                r["setup"], r["round"] = setup, rnd
                results.append(r)
                line.append(f"{setup}{'' if d is None else f'@{d.density:g}'} {r['sps']:.0f}")
            b = next(r["sps"] for r in results if r["round"] == rnd and r["setup"] == "bare")
            print(f"round {rnd}: " + ", ".join(line) + f"  (bare {b:.0f}; others "
                  f"{med([r['others_cpu'] for r in results if r['round'] == rnd]):.2f} CPU)", flush=True)
        if args.profile and daemons:
            for other in daemons[1:]:
                other.pause()
            prof = profile_flood(args, daemons[0], log_dir)
    finally:
        if bare is not None:
            bare.close()
        for d in daemons:
            d.stop()
    elapsed = time.monotonic() - started

    speed, sizes, headline = build_tables(results, densities, modes)
    print()
    print(speed)
    print()
    print(sizes)
    if prof:
        print()
        print(profile_markdown(prof))
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "profile": prof}, indent=1, default=str))
    shutil.rmtree(log_dir, ignore_errors=True)
    if args.no_write:
        return 0

    import torch

    d0 = densities[0]
    t, c = ncfg["training"], ncfg["compression"]
    verdict = [f"{mode} {headline[(d0, mode)][0]:.2f}" for mode in ("flood", "flood-nice", "paced", "idle")
               if (d0, mode) in headline]
    if pinned:
        noise = textwrap.fill(
            "Pinned, the node has its own core in every setup: the worker CPU column shows how much of "
            "it the worker gets, the rest going to the daemon (served) or to other people's jobs landing "
            "on that core (*others*, machine-wide). The wall-clock ratio is then what serving costs a node "
            "whose peers are other machines; the per-CPU-second ratio is the cost inside the step itself "
            "(cache, memory bandwidth, the other core's load).", width=100, break_on_hyphens=False)
    else:
        noise = textwrap.fill(
            f"Noise: the machine is saturated in every slice (worker + daemon + pullers + others add up to "
            f"about {os.cpu_count()} cores), so the worker's share moves with whatever else runs and with how "
            f"the kernel splits CPU between sessions (autogroups); compare the *worker CPU* column across "
            f"rows. The wall-clock ratio is therefore wide (see its IQR); the per-CPU-second ratio is the "
            f"cost of the code itself, and the CPU columns are what serving takes from a machine.",
            width=100, break_on_hyphens=False)
    text = f"""{SECTION}

One node's training speed while its daemon serves three peers, against the same training loop
run bare, in one run (`scripts/bench_overhead.py`; its docstring has the method), CPUs
{"pinned: node on one core, pullers on another (peers on other machines)" if pinned else "unpinned: node and pullers share the cores"}. Served / bare
at {"the default" if d0 == default_density else "a"} {d0 * 100:g} % publish density, median of per-round ratios: {', '.join(verdict)}
(goal: at least 0.9).

```
{command}
```

- date: {dt.datetime.now(dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}; the run took {elapsed:.0f} s
- machine: {os.cpu_count()} CPUs ({cpu_model()}), shared with other jobs (load average {load0[0]:.1f} at
  the start); Python {platform.python_version()}, torch {torch.__version__}
- node config (this tree's defaults plus {', '.join(f"`{x}`" for x in sets) or "nothing"}; one
  frozen file shared by bare and daemon): model {t['model']} on {t['data']}, batch {t['batch_size']},
  {t['threads']} torch thread(s), lr {t['lr']:g}, gradient compressor `{c['gradient']}` (memory
  `{c['gradient_memory']}`), publish `topk:density=D` every {c['publish_every']} step(s), values
  {c['value_dtype']}, log of {c['log_size']} versions
- CPU placement: {placement}
- processes started with {"`" + " ".join(f"{k}={v}" for k, v in STABLE_MALLOC.items()) + "` (`--malloc stable`)" if ENV else "glibc's default malloc settings"}
- {args.rounds} rounds, each measuring every setup for {args.window:g} s in a shuffled order;
  {args.loops} pullers in {args.puller_procs} process(es) per set; "paced" = one pull every
  {1e3 * pace:.0f} ms per puller (bare's step time)

Medians over rounds; "/ bare" is the median of per-round ratios (interquartile range in
brackets). CPU columns are cores in use (CPU seconds per second) during the window: *worker* the
training process (for bare: the bare process), *daemon* the `p2pnode start` process (event
loop, pipe reader, thread pool), *pullers* the emulated peers, *others* the rest of the machine
(other people's jobs). *ms CPU/step* is the worker's CPU time per training step, *page faults/step* its minor page
faults per step (glibc returning freed activations to the kernel and faulting them in again:
system time that varies from process to process). *Per
CPU-second / bare* compares samples per second of worker CPU: what is left of the slowdown once
the CPU the worker did not get is discounted. *Daemon µs CPU/request* is the daemon's CPU above
its idle level divided by the requests it answered.

{speed}

{reading(results, d0, pinned)}

{noise}

Bytes per exchange: mean payload bytes by kind over all rounds, and % of the dense fp32 model:

{sizes}
"""
    if prof:
        text += f"""
Where the CPU goes while the pullers run flat out ({d0 * 100:g} %; py-spy, {args.profile_seconds:g} s
at 100 Hz, threads that run or wait for a CPU, each stack counted in the first matching bucket):

{profile_markdown(prof)}
"""
    write_section(text)
    print(f"\nwrote the '{SECTION}' section of {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
